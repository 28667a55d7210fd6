#!/usr/bin/env bash
# End-to-end test of the compose stack (make e2e-compose): build the images, start the
# stack (mutual TLS everywhere, certificates from its certs service), write data and check
# every node holds exactly what it must, check that a client without a certificate and a
# viewer's drain are refused, kill the assigner leader and see the standby take over, kill a
# distributor, write more, check again, tear everything down. Skips (exit 0) when there is no usable Docker engine or compose tool.
#
# Environment:
#   E2E_KEYS=10000        items written before the failures (as many again after)
#   E2E_LOAD_SECONDS=20   read load before the first check, so that slices move by load
#   E2E_SKIP_BUILD=1      use the sliceplane/*:$SLICEPLANE_TAG images already built
#   E2E_KEEP=1            leave the stack running at the end (prints how to remove it)
#   E2E_TIMEOUT=120       seconds each wait may take (health, leader, convergence)
#   SLICEPLANE_TAG=dev    image tag
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
file=$here/docker-compose.yml
keys=${E2E_KEYS:-10000}
load_s=${E2E_LOAD_SECONDS:-20}
wait_s=${E2E_TIMEOUT:-120}
export SLICEPLANE_TAG=${SLICEPLANE_TAG:-dev}

skip() {
	echo "e2e-compose: skipped: $*"
	exit 0
}

# --- is there anything to run on? ----------------------------------------------------------
command -v docker >/dev/null 2>&1 || skip "no docker command on PATH"
timeout 20 docker info >/dev/null 2>&1 || skip "the Docker engine does not answer ('docker info' fails)"
if timeout 20 docker compose version >/dev/null 2>&1; then
	compose_cmd=(docker compose)
elif command -v docker-compose >/dev/null 2>&1 && timeout 20 docker-compose version >/dev/null 2>&1; then
	compose_cmd=(docker-compose)
else
	skip "neither 'docker compose' nor 'docker-compose' is available"
fi

# --- helpers -------------------------------------------------------------------------------
project=sliceplanee2e$$$(date +%s)
start=$(date +%s.%N)
timings=()
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
log() { printf '[e2e %6ss] %s\n' "$(elapsed "$start")" "$*"; }
# step NAME START: record how long NAME took since START.
step() {
	timings+=("$(printf '%-56s %7ss' "$1" "$(elapsed "$2")")")
	log "$1: $(elapsed "$2")s"
}
fail() {
	log "FAIL: $*"
	exit 1
}
compose() { timeout 300 "${compose_cmd[@]}" -f "$file" -p "$project" "$@"; }
# tool SERVICE ARGS...: run a tool container (kvload, slicectl) on the stack's network.
tool() { timeout "$((wait_s + 60))" "${compose_cmd[@]}" -f "$file" -p "$project" run --rm -T "$@"; }

# Container IDs by service, read once the stack is up from the labels compose puts on them
# (one docker call; compose v1 takes a second or more per "ps").
declare -A cid
find_containers() {
	local svc id
	while read -r svc id; do
		cid[$svc]=$id
	done < <(docker ps -a --filter "label=com.docker.compose.project=$project" \
		--format '{{.Label "com.docker.compose.service"}} {{.ID}}')
}
container() {
	[ -n "${cid[$1]:-}" ] || fail "no container for service $1"
	echo "${cid[$1]}"
}
# The assigners' certificate (every server wants a client certificate, the probe too).
assigner_tls=(-tls-cert /certs/assigner-assigner.crt -tls-key /certs/assigner-assigner.key -tls-ca /certs/ca.crt)
is_leader() {
	timeout 10 docker exec "$(container "$1")" /usr/local/bin/probe grpc 127.0.0.1:7070 \
		-service sliceplane.leader -timeout 2s "${assigner_tls[@]}" >/dev/null 2>&1
}
# leaders: the assigners that say they lead, space-separated.
leaders() {
	local found=() a
	for a in assigner-1 assigner-2; do
		if [ "$(docker inspect -f '{{.State.Running}}' "$(container "$a")")" = true ] && is_leader "$a"; then
			found+=("$a")
		fi
	done
	echo "${found[*]}"
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ "$rc" != 0 ]; then
		log "failed (exit $rc); the stack as it was:"
		COMPOSE_PROFILES=load compose ps || true
		COMPOSE_PROFILES=load compose logs --no-color --tail=30 || true
	fi
	if [ "${E2E_KEEP:-0}" = 1 ]; then
		log "E2E_KEEP=1: left running; remove with: ${compose_cmd[*]} -f $file -p $project down -v"
	else
		local t
		t=$(now)
		# The profiles too: docker-compose v1 leaves the services of profiles not enabled.
		COMPOSE_PROFILES=load,tools compose down -v --remove-orphans -t 5 >/dev/null 2>&1 ||
			log "WARNING: '${compose_cmd[*]} -p $project down -v' failed"
		step "tear down" "$t"
	fi
	if [ "${#timings[@]}" -gt 0 ]; then
		echo "e2e-compose timings:"
		printf '  %s\n' "${timings[@]}"
		printf '  %-56s %7ss\n' total "$(elapsed "$start")"
	fi
	if [ "$rc" = 0 ]; then echo "e2e-compose: PASS"; else echo "e2e-compose: FAIL"; fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "compose: ${compose_cmd[*]}; project $project; $keys keys"

# --- build ---------------------------------------------------------------------------------
if [ "${E2E_SKIP_BUILD:-0}" != 1 ]; then
	t=$(now)
	TAG=$SLICEPLANE_TAG "$here/build-images.sh"
	step "build binaries and images" "$t"
fi
up_args=()
for img in etcd assigner distributor kvnode kvload slicectl; do
	docker image inspect "sliceplane/$img:$SLICEPLANE_TAG" >/dev/null 2>&1 ||
		fail "no image sliceplane/$img:$SLICEPLANE_TAG (run deploy/compose/build-images.sh)"
done
prometheus=1
if ! docker image inspect "sliceplane/prometheus:$SLICEPLANE_TAG" >/dev/null 2>&1; then
	log "no sliceplane/prometheus image (no prometheus binary at build time): running without it"
	prometheus=0
fi
# Every long-running service by name (certs comes first as their dependency), so that
# compose pulls nothing it was not asked for: "--scale prometheus=0" still tries to pull a
# missing image from a registry.
services=(etcd-1 etcd-2 etcd-3 assigner-1 assigner-2 distributor-1 distributor-2 kvnode-1 kvnode-2 kvnode-3 kvnode-4)
[ "$prometheus" = 1 ] && services+=(prometheus)
up_args+=("${services[@]}")

# --- up ------------------------------------------------------------------------------------
# Host ports empty: Docker picks free ones, so a developer's stack or a loopback demo on
# 7070/9090 does not collide with this one.
export SLICEPLANE_ASSIGNER_1_PORT='' SLICEPLANE_ASSIGNER_2_PORT='' SLICEPLANE_PROMETHEUS_PORT=''
t=$(now)
out=$(compose up -d "${up_args[@]}" 2>&1) || {
	printf '%s\n' "$out" >&2
	fail "compose up"
}
step "compose up (containers created)" "$t"

t=$(now)
find_containers
ids=()
for s in "${services[@]}"; do
	[ -n "${cid[$s]:-}" ] || fail "no container for service $s"
	ids+=("${cid[$s]}")
done
deadline=$(($(date +%s) + wait_s))
while :; do
	not=$(docker inspect -f '{{.Name}} {{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "${ids[@]}" | grep -v ' healthy$' || true)
	[ -z "$not" ] && break
	[ "$(date +%s)" -lt "$deadline" ] || fail "not healthy after ${wait_s}s: $(echo "$not" | tr '\n' ';')"
	sleep 1
done
step "every container healthy" "$t"

t=$(now)
deadline=$(($(date +%s) + wait_s))
while :; do
	lead=$(leaders)
	case "$lead" in
	assigner-1 | assigner-2) break ;;
	esac
	[ "$(date +%s)" -lt "$deadline" ] || fail "no single assigner leader after ${wait_s}s (leaders: '${lead}')"
	sleep 0.5
done
if [ "$lead" = assigner-1 ]; then standby=assigner-2; else standby=assigner-1; fi
step "one leader ($lead), one standby ($standby)" "$t"

# slices_per_node logs how many slices each node holds, from the leader's map (informational).
slices_per_node() {
	local out
	if out=$(tool slicectl nodes 2>&1); then
		printf '%s\n' "$out" | grep -v -e '^Creating' -e '^Starting' | sed 's/^/    slicectl nodes | /'
	fi
}

nodes=https://kvnode-1:7090,https://kvnode-2:7090,https://kvnode-3:7090,https://kvnode-4:7090
check() {
	local out
	if ! out=$(tool kvload check --nodes "$nodes" --timeout "${wait_s}s" 2>&1); then
		printf '%s\n' "$out" | grep -v -e '^Creating' -e '^Starting' >&2
		fail "kvload check: $1"
	fi
	log "kvload check: $(printf '%s\n' "$out" | grep -v -e '^Creating' -e '^Starting' | tail -1)"
}

# --- data, and a first check ---------------------------------------------------------------
t=$(now)
out=$(tool kvload fill --keys "$keys" 2>&1) || {
	echo "$out" >&2
	fail "kvload fill"
}
log "kvload fill: $(echo "$out" | grep -v -e '^Creating' -e '^Starting' | tail -1)"
step "write $keys items (kvload fill)" "$t"

# Reads through the router make load, and the assigner balances the slices by it. Writes
# go on meanwhile, so slices move while their items change.
t=$(now)
out=$(tool kvload run --duration "${load_s}s" --rate 300 --write-rate 20 --workload zipf:1.1 2>&1) || {
	echo "$out" >&2
	fail "kvload run"
}
summary=$(echo "$out" | grep -v -e '^Creating' -e '^Starting' | tail -1)
log "kvload run: $summary"
# The reads go through the router to the nodes, all of it over mutual TLS: most must hit.
reads=$(grep -o 'reads=[0-9]*' <<<"$summary" | cut -d= -f2)
hits=$(grep -o 'hits=[0-9]*' <<<"$summary" | cut -d= -f2)
errors=$(grep -o 'errors=[0-9]*' <<<"$summary" | cut -d= -f2)
[ "${hits:-0}" -gt 0 ] && [ "$((${errors:-0} * 10))" -le "${reads:-0}" ] ||
	fail "kvload run: reads through the router fail: $summary"
step "read load for ${load_s}s (kvload run)" "$t"

t=$(now)
check "after the first fill"
step "converged (kvload check)" "$t"
slices_per_node

# --- closed by default ----------------------------------------------------------------------
# The slicectl service is the admin; the same image with other certificates, or none.
t=$(now)
slicectl_as() {
	local who=$1
	shift
	local tls=()
	[ "$who" != none ] && tls=("--tls-cert=/certs/$who.crt" "--tls-key=/certs/$who.key" --tls-ca=/certs/ca.crt)
	tool --entrypoint /entrypoint slicectl --assigner=assigner-1:7070,assigner-2:7070 "${tls[@]}" "$@" 2>&1 |
		grep -v -e '^Creating' -e '^Starting'
	return "${PIPESTATUS[0]}"
}
if out=$(slicectl_as none --timeout=3s status); then
	fail "slicectl with no certificate was let in: $out"
fi
log "no certificate: refused ($(printf '%s\n' "$out" | grep -m1 'slicectl:'))"
out=$(slicectl_as viewer-prometheus status) || fail "a viewer cannot read the status: $out"
if out=$(slicectl_as viewer-prometheus drain n1); then
	fail "a viewer drained a node: $out"
fi
printf '%s\n' "$out" | grep -qi 'permission' || fail "a viewer's drain: no permission denied: $out"
log "viewer: status allowed, drain refused ($(printf '%s\n' "$out" | grep -m1 -i 'permission'))"
# The admin's changes are kept with its identity (the audit trail).
tool slicectl freeze --reason e2e >/dev/null 2>&1 || fail "slicectl freeze (admin)"
tool slicectl unfreeze >/dev/null 2>&1 || fail "slicectl unfreeze (admin)"
out=$(tool slicectl quanta 2>&1) || fail "slicectl quanta: $out"
printf '%s\n' "$out" | grep -q 'spiffe://sliceplane/admin/admin' ||
	fail "slicectl quanta does not name the admin who froze: $(printf '%s\n' "$out" | tail -5)"
step "mTLS: no cert refused, viewer cannot drain, admin audited" "$t"

if [ "$prometheus" = 1 ]; then
	# Every process's /metrics is scraped and the alerting rules are loaded.
	t=$(now)
	port=$(compose port prometheus 9090 | tail -1)
	want=${#services[@]} # every service above is one target
	deadline=$(($(date +%s) + wait_s))
	while :; do
		up=$(curl -fsS --max-time 5 "http://$port/api/v1/query?query=count(up%3D%3D1)" 2>/dev/null |
			grep -o '"value":\[[^]]*\]' | grep -o '"[0-9]*"\]' | tr -dc 0-9 || true)
		[ "${up:-0}" -ge "$want" ] && break
		[ "$(date +%s)" -lt "$deadline" ] || fail "Prometheus sees ${up:-0} of $want targets up"
		sleep 1
	done
	rules=$(curl -fsS --max-time 5 "http://$port/api/v1/rules" | grep -o '"name":"Sliceplane[A-Za-z]*"' | sort -u | wc -l)
	[ "$rules" -ge 5 ] || fail "Prometheus loaded $rules Sliceplane alerts"
	step "Prometheus: $up targets up, $rules alerts loaded" "$t"
fi

# --- kill the leader -----------------------------------------------------------------------
# Under load: the compose file's load generator (reads through the router, 10 writes/s).
compose up -d load >/dev/null 2>&1 || fail "starting the load generator"
log "started the load generator (service load)"
t=$(now)
docker kill "$(container "$lead")" >/dev/null
log "killed the leader $lead"
deadline=$(($(date +%s) + wait_s))
until is_leader "$standby"; do
	[ "$(date +%s)" -lt "$deadline" ] || fail "standby $standby did not take over within ${wait_s}s"
	sleep 0.2
done
step "failover: $standby leads after SIGKILL of $lead" "$t"
# The same from the new leader's log, without the polling: kill to "leading".
led=$(docker logs "$(container "$standby")" 2>&1 | grep '"msg":"leading' | tail -1 |
	grep -o '"time":"[^"]*"' | cut -d'"' -f4 || true)
if [ -n "$led" ] && led=$(date -d "$led" +%s.%N 2>/dev/null); then
	log "failover by the new leader's log: $(awk -v a="$t" -v b="$led" 'BEGIN { printf "%.2f", b - a }')s from the kill to \"leading\" (--session-ttl 5s)"
fi

# What the operator sees (informational: its format is slicectl's business).
if out=$(tool slicectl status 2>&1); then
	printf '%s\n' "$out" | grep -v -e '^Creating' -e '^Starting' | sed 's/^/    slicectl status | /'
else
	log "WARNING: slicectl status failed: $(printf '%s\n' "$out" | tail -1)"
fi

# --- kill a distributor, write more ----------------------------------------------------------
t=$(now)
docker kill "$(container distributor-1)" >/dev/null
log "killed distributor-1 (d1)"
out=$(tool kvload fill --keys "$((keys * 2))" 2>&1) || {
	echo "$out" >&2
	fail "kvload fill after the failures"
}
log "kvload fill: $(echo "$out" | grep -v -e '^Creating' -e '^Starting' | tail -1)"
tool slicectl data --etcd-endpoints https://etcd-1:2379,https://etcd-2:2379,https://etcd-3:2379 \
	--prefix /sliceplane/data/ delete key-1 >/dev/null 2>&1 || fail "slicectl data delete key-1"
# kvload check wants the writers stopped.
compose stop -t 5 load >/dev/null 2>&1 || fail "stopping the load generator"
step "write $((keys * 2)) items, delete 1 (d1 down, under load)" "$t"

t=$(now)
check "after the leader and a distributor died"
step "converged again, nothing lost or leaked" "$t"
slices_per_node

# --- the old leader comes back as a standby ---------------------------------------------------
t=$(now)
docker start "$(container "$lead")" >/dev/null
deadline=$(($(date +%s) + wait_s))
until [ "$(docker inspect -f '{{.State.Health.Status}}' "$(container "$lead")")" = healthy ]; do
	[ "$(date +%s)" -lt "$deadline" ] || fail "$lead did not come back healthy"
	sleep 1
done
lead2=$(leaders)
[ "$lead2" = "$standby" ] || fail "after $lead restarted, leaders are '$lead2', want '$standby'"
step "$lead restarted, stands by; $standby still leads" "$t"
