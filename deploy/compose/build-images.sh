#!/usr/bin/env bash
# Builds Sliceplane's static binaries and one image per binary, FROM scratch (no registry,
# no base image): sliceplane/<binary>:<tag>.
#
#   deploy/compose/build-images.sh              # every binary, every image
#   deploy/compose/build-images.sh --no-images  # binaries only, into deploy/.build/bin
#   TAG=test deploy/compose/build-images.sh     # sliceplane/<binary>:test
#
# Binaries: assigner, distributor, slicectl (cmd/), etcd (go.etcd.io/etcd/server/v3, built
# from inside our module, see STACK.md), probe (deploy/docker/probe, the images' health
# check) and the example key-value store's commands (examples/kvstore/cmd/*: kvnode,
# kvload, ...) when they exist. The prometheus image is made from a prometheus binary on
# this machine (PROMETHEUS_BIN, default: `command -v prometheus`, e.g. Debian's package)
# plus the shared libraries `ldd` names; without one it is skipped with a warning.
#
# Everything built goes to deploy/.build/ (git-ignored).
set -euo pipefail

GO=${GO:-go}
DOCKER=${DOCKER:-docker}
TAG=${TAG:-dev}
images=1
case "${1:-}" in
"") ;;
--no-images) images=0 ;;
-h | --help)
	sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
	exit 0
	;;
*)
	echo "usage: $0 [--no-images]" >&2
	exit 2
	;;
esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=$root/deploy/.build
bin=$out/bin
dockerfile=$root/deploy/docker/Dockerfile
cd "$root"
rm -rf "$bin" # no stale binary becomes an image
mkdir -p "$bin"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
log() { printf '[build-images] %s\n' "$*" >&2; }

# --- binaries ------------------------------------------------------------------------------
t0=$(now)
export CGO_ENABLED=0
goflags=(-trimpath -ldflags=-s\ -w)
pkgs=(./cmd/... ./deploy/docker/probe)
examples=()
for d in examples/kvstore/cmd/*/; do
	[ -f "$d/main.go" ] && examples+=("./${d%/}")
done
pkgs+=("${examples[@]}")
log "go build ${pkgs[*]}"
"$GO" build "${goflags[@]}" -o "$bin/" "${pkgs[@]}"
log "go build go.etcd.io/etcd/server/v3 -> etcd"
"$GO" build "${goflags[@]}" -o "$bin/etcd" go.etcd.io/etcd/server/v3
built=()
for b in "$bin"/*; do built+=("${b##*/}"); done
log "binaries built in $(since "$t0"): ${built[*]}"
[ "$images" = 1 ] || exit 0

# --- images --------------------------------------------------------------------------------
if ! "$DOCKER" info >/dev/null 2>&1; then
	echo "build-images: no usable Docker engine ('$DOCKER info' fails)" >&2
	exit 1
fi
# The classic builder needs nothing but the engine; BuildKit needs the buildx plugin.
if ! "$DOCKER" buildx version >/dev/null 2>&1; then
	export DOCKER_BUILDKIT=0
fi
version=$(git describe --always --dirty 2>/dev/null || echo dev)

t1=$(now)
ctx=$out/context
rm -rf "$ctx"
mkdir -p "$ctx"

# What every image holds besides its binary: users for USER 65534, a sticky /tmp, and an
# nsswitch.conf so that host lookups read /etc/hosts first (Docker's DNS then).
common=$ctx/.common
mkdir -p "$common/rootfs/etc" "$common/rootfs/tmp" "$common/data"
chmod 1777 "$common/rootfs/tmp"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' >"$common/rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$common/rootfs/etc/group"
printf 'hosts: files dns\n' >"$common/rootfs/etc/nsswitch.conf"

mkdir -p "$common/rootfs/usr/local/bin"
cp "$bin/probe" "$common/rootfs/usr/local/bin/probe"

# stage NAME BINARY: a build context for image NAME, hard-linking what it can.
stage() {
	local dir=$ctx/$1
	mkdir -p "$dir/bin"
	cp -al "$common/rootfs" "$common/data" "$dir/" 2>/dev/null || cp -a "$common/rootfs" "$common/data" "$dir/"
	ln -f "$2" "$dir/bin/$1" 2>/dev/null || cp "$2" "$dir/bin/$1"
}

names=()
for b in "$bin"/*; do
	name=$(basename "$b")
	[ "$name" = probe ] && continue
	stage "$name" "$b"
	names+=("$name")
done

prometheus=${PROMETHEUS_BIN:-$(command -v prometheus || true)}
if [ -n "$prometheus" ] && [ -x "$prometheus" ]; then
	stage prometheus "$prometheus"
	extra=$ctx/prometheus/rootfs
	# A dynamically linked build (Debian's links the C library) needs its loader and libraries.
	if ldd "$prometheus" >/dev/null 2>&1; then
		ldd "$prometheus" | grep -o '/[^ ]*' | sort -u | while read -r lib; do
			mkdir -p "$extra$(dirname "$lib")"
			cp -L "$lib" "$extra$lib"
		done
	fi
	# Debian's build serves its classic web UI from here. Its JavaScript libraries are symlinks
	# into /usr/share/javascript (moment-timezone alone is 200 MB there): copy of those only
	# the files the pages load.
	web=/usr/share/prometheus/web
	if [ -d "$web" ]; then
		mkdir -p "$extra/usr/share/prometheus"
		cp -r "$web" "$extra/usr/share/prometheus/"
		find "$extra$web" -type l -delete
		grep -rhoE 'static/[A-Za-z0-9_./-]+' "$web/templates" | sort -u | while read -r f; do
			if [ -f "$web/$f" ] && [ ! -e "$extra$web/$f" ]; then
				mkdir -p "$(dirname "$extra$web/$f")"
				cp -L "$web/$f" "$extra$web/$f"
			fi
		done
	fi
	# A default configuration, so that the image runs alone; compose mounts deploy/prometheus.
	mkdir -p "$extra/etc/prometheus"
	cp deploy/prometheus/prometheus.yml deploy/prometheus/rules.yml "$extra/etc/prometheus/"
	names+=(prometheus)
else
	log "WARNING: no prometheus binary (install Debian's 'prometheus' or set PROMETHEUS_BIN): no sliceplane/prometheus image"
fi

# build NAME: one image; the classic builder is slow per step, so several run at once.
build() {
	"$DOCKER" build --quiet -f "$dockerfile" --build-arg "BINARY=$1" \
		--label "org.opencontainers.image.title=sliceplane-$1" \
		--label "org.opencontainers.image.version=$version" \
		--label "org.opencontainers.image.source=https://github.com/sliceplane/sliceplane" \
		-t "sliceplane/$1:$TAG" "$ctx/$1"
}
jobs=${BUILD_JOBS:-4}
pids=()
for name in "${names[@]}"; do
	build "$name" >"$ctx/$name.log" 2>&1 &
	pids+=("$!")
	if [ "${#pids[@]}" -ge "$jobs" ]; then
		wait "${pids[0]}" || true
		pids=("${pids[@]:1}")
	fi
done
wait
failed=0
for name in "${names[@]}"; do
	# The build's output ends with the image ID when it succeeded.
	if ! "$DOCKER" image inspect "sliceplane/$name:$TAG" >/dev/null 2>&1 ||
		[ "$(tail -1 "$ctx/$name.log")" != "$("$DOCKER" image inspect -f '{{.Id}}' "sliceplane/$name:$TAG")" ]; then
		grep -v -i -e deprecated -e buildkit -e 'environment-variable' -e '^ *$' "$ctx/$name.log" >&2 || true
		echo "build-images: building sliceplane/$name:$TAG failed" >&2
		failed=1
	fi
done
[ "$failed" = 0 ] || exit 1
log "sliceplane/{$(
	IFS=,
	echo "${names[*]}"
)}:$TAG"
# The images these replaced, now untagged.
"$DOCKER" image prune -f --filter "label=org.opencontainers.image.source=https://github.com/sliceplane/sliceplane" >/dev/null 2>&1 || true
log "images built in $(since "$t1"); total $(since "$t0")"
