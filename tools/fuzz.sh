#!/usr/bin/env bash
# Runs every Go fuzz target of the module for a while each: tools/fuzz.sh [DURATION] [PACKAGE...]
# (default 60s, every package with a fuzz target). `go test -fuzz` takes one package and one
# target per run, so each package's test binary is built once, with the fuzzing
# instrumentation, and asked for its targets (-test.list): a new FuzzXxx is picked up without
# a change here. A failing input is written to the package's testdata/fuzz/FuzzXxx/: commit
# it with the fix, as a regression seed.
set -euo pipefail

fuzztime=${1:-60s}
shift || true
go=${GO:-go}
cd "$(dirname "$0")/.."

if [ $# -gt 0 ]; then
	pkgs=("$@")
else
	# Only packages whose tests declare a fuzz target: building every package's tests is slow.
	mapfile -t pkgs < <(git grep -l -E '^func Fuzz[A-Z0-9_][A-Za-z0-9_]*\(f \*testing\.F\)' -- '*_test.go' |
		xargs -r -n1 dirname | sort -u | sed 's|^|./|')
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cache=$($go env GOCACHE)/fuzz
count=0
flaked=0
for pkg in "${pkgs[@]}"; do
	bin=$tmp/pkg.test
	$go test -c -fuzz . -o "$bin" "$pkg"
	importpath=$($go list "$pkg")
	dir=$($go list -f '{{.Dir}}' "$pkg")
	for target in $("$bin" -test.list '^Fuzz' | grep '^Fuzz' || true); do
		echo "fuzz: $pkg $target for $fuzztime"
		# Run in the package's directory, as go test does, so the corpus in testdata/ is read.
		rc=0
		(cd "$dir" && "$bin" -test.run '^$' -test.fuzz "^${target}\$" -test.fuzztime "$fuzztime" \
			-test.fuzzcachedir "$cache/$importpath") 2>&1 | tee "$tmp/out" || rc=$?
		count=$((count + 1))
		[ "$rc" -eq 0 ] && continue
		# On a starved machine the engine itself can stop a run that found nothing: "context
		# deadline exceeded" at the end of -fuzztime (golang/go#51484), or a worker it took for
		# hung (golang/go#56238). A finding always writes its input; only those fail.
		if ! grep -q 'Failing input written to' "$tmp/out" &&
			grep -qE 'context deadline exceeded|fuzzing process hung or terminated unexpectedly' "$tmp/out"; then
			echo "fuzz: $pkg $target: the fuzzing engine stopped without a failing input; not a finding"
			flaked=$((flaked + 1))
			continue
		fi
		echo "fuzz: $pkg $target FAILED"
		exit 1
	done
done
echo "fuzz: $count targets, $fuzztime each ($flaked stopped early by the engine)"
