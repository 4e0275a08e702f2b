#!/usr/bin/env bash
# Runs the benchmarks of the published table (bench/RESULTS.md) and prints
# the table as markdown, ratios included.
#
#   bench/run.sh           the table: every row as RESULTS.md describes it
#                          (several minutes; run it on a quiet machine)
#   bench/run.sh --smoke   every benchmark of the bench module and the table's
#                          library benchmarks once (-benchtime 1x), then the
#                          table from those runs: proves they all run and the
#                          table is complete; its figures mean nothing
#
# Each test binary is built once; each benchmark process writes its output
# to a file of its own under $BENCH_OUT (default: a new temporary directory),
# which the table is computed from.
set -euo pipefail

smoke=
case "${1:-}" in
  "") ;;
  --smoke) smoke=1 ;;
  *) echo "usage: $0 [--smoke]" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "$0")/.." && pwd)"
if [ -n "${BENCH_OUT:-}" ]; then
  out="$BENCH_OUT"
else
  out="$(mktemp -d)"
  # A smoke's output is of no use once it passed or failed.
  if [ -n "$smoke" ]; then trap 'rm -rf "$out"' EXIT; fi
fi
mkdir -p "$out/bin"

echo "== building test binaries" >&2
(cd "$root" && go test -c -o "$out/bin/consumer.test" ./consumer/)
for p in policy scope kafka nats; do
  (cd "$root/bench" && go test -c -o "$out/bin/$p.test" "./$p/")
done
(cd "$root/bench" && go build -o "$out/bin/benchtable" ./cmd/benchtable)

# bench NAME DIR BINARY ARGS... runs one benchmark process in DIR (the
# package's directory, as go test would) and keeps its output in $out/NAME.txt.
bench() {
  local name=$1 dir=$2 bin=$3
  shift 3
  echo "== $name: ${bin##*/} $*" >&2
  (cd "$dir" && "$out/bin/$bin" -test.run '^$' "$@") >"$out/$name.txt"
}

if [ -n "$smoke" ]; then
  once=(-test.bench . -test.benchtime 1x -test.benchmem)
  bench policy  "$root/bench/policy" policy.test "${once[@]}"
  bench scope   "$root/bench/scope"  scope.test  "${once[@]}"
  bench kafka   "$root/bench/kafka"  kafka.test  "${once[@]}"
  bench nats    "$root/bench/nats"   nats.test   "${once[@]}"
  bench engine  "$root/consumer" consumer.test -test.bench 'Engine$|TenantPipeline$|Handler$' -test.benchtime 1x
else
  # A row of one run reads whatever the host did in its second: the guard
  # and scope-hit cells are the medians of three.
  bench policy "$root/bench/policy" policy.test -test.bench . -test.benchmem -test.count 3
  bench scope  "$root/bench/scope"  scope.test  -test.bench 'Hit' -test.benchmem -test.count 3
  # A tail percentile moves from run to run more than a mean: the churn
  # rows' table cells are the medians of five. A fixed count of lookups
  # runs each row's warm-up once a run rather than once per b.N tried.
  bench scope-churn "$root/bench/scope" scope.test -test.bench 'Churn' -test.benchmem -test.benchtime 2000000x -test.count 5
  bench engine "$root/consumer" consumer.test -test.bench 'Engine$|TenantPipeline$' -test.benchtime 300000x -test.count 5
  # The paired rows run a process per round: the host moves the cores
  # between rounds, and a ratio within one process sees one placement.
  for i in 1 2 3 4 5; do
    bench "handler.$i" "$root/consumer" consumer.test -test.bench 'Handler$'
  done
  for i in 1 2 3 4 5; do
    bench "kafka.$i" "$root/bench/kafka" kafka.test -test.bench 'Consume$' -test.benchtime 1x -test.count 3
  done
  # The engine on the GroupSource against kgo's own loop varies more from
  # process to process than any other pair: more processes of those two
  # rows alone.
  for i in $(seq 12); do
    bench "kafka-group.$i" "$root/bench/kafka" kafka.test -test.bench 'Consume$/(franz-go-kgo$|ringfence-group-engine$)' -test.benchtime 1x -test.count 3
  done
  for i in 1 2 3 4 5; do
    bench "kafka-tenants.$i" "$root/bench/kafka" kafka.test -test.bench 'ConsumeTenants$' -test.benchtime 1x -test.count 3
  done
  for i in 1 2 3 4 5 6 7; do
    bench "nats.$i" "$root/bench/nats" nats.test -test.bench 'Consume$' -test.benchtime 50000x
  done
fi

if [ -z "$smoke" ]; then echo "== raw output in $out" >&2; fi
echo "$(go version); $(nproc) cores:$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2)"
echo
"$out/bin/benchtable" "$out"/*.txt
