#!/usr/bin/env bash
# bench-redis.sh: stockctl bench's full comparison, Redis peers included.
#
# Installs Debian's redis-server if it is missing, starts a throwaway one on
# 127.0.0.1 (a free port, no persistence, in a temporary directory), builds
# the benchredis module's binary (stockctl with the Redis strategies), runs
# every strategy at every shape (by default a single lock and the main
# table: --runs 1x2,20x40,20x200,100x200) on an embedded etcd (fsync on),
# then stockctl alone with --affinity segment, then the sale shapes (bench
# --sale: sell-out storms, releases racing them, 1, 1,000 and 10,000 SKUs,
# the physical limit at 64 puts a commit) with redis-lua,
# then the main table and the sale shapes of the etcd strategies on a
# 3-member embedded cluster (what replication costs), and stops Redis
# whatever happens.
#
#   scripts/bench-redis.sh [stockctl bench flags...]
#
# Results: $BENCH_OUT (default /tmp/stockctl-bench) gets each run's JSON
# (bench, affinity, sale, sale-limits, cluster3, sale-cluster3) and the Markdown tables
# made from it by scripts/bench-tables.py (the same names, .txt), and
# redis.log; the plot goes to $BENCH_PLOT (default
# docs/benchmarks.svg). BENCH_AFFINITY=0, BENCH_SALE=0 and BENCH_CLUSTER=0
# skip those runs; BENCH_LIMITS=1 adds one of the physical limit alone at
# 1, 4, 18 and 64 puts a commit (sale-limits). The flags given are passed
# to the lock-shape runs only.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${BENCH_OUT:-/tmp/stockctl-bench}
plot=${BENCH_PLOT:-$root/docs/benchmarks.svg}
mkdir -p "$out"

if ! command -v redis-server >/dev/null; then
	echo "redis-server is missing: installing Debian's package" >&2
	sudo=""
	if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
	$sudo apt-get update -qq
	# policy-rc.d-less containers would start the packaged service; ours
	# runs on its own port regardless.
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
fi

echo "building the benchredis binary" >&2
(cd "$root/benchredis" && go build -o stockctl-bench ./cmd/stockctl-bench)
bin=$root/benchredis/stockctl-bench

tmp=$(mktemp -d "${TMPDIR:-/tmp}/stockctl-redis-XXXXXX")
pid=""
cleanup() {
	if [ -n "$pid" ]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	cp "$tmp/redis.log" "$out/redis.log" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

# A free port: let redis-server try random ones until one binds (it exits
# at once when the port is taken).
port=""
for _ in $(seq 1 20); do
	try=$((20000 + RANDOM % 40000))
	redis-server --bind 127.0.0.1 --port "$try" --save '' --appendonly no --dir "$tmp" \
		--protected-mode yes --logfile "$tmp/redis.log" --daemonize no &
	pid=$!
	for _ in $(seq 1 50); do
		if redis-cli -h 127.0.0.1 -p "$try" ping >/dev/null 2>&1; then
			port=$try
			break
		fi
		if ! kill -0 "$pid" 2>/dev/null; then break; fi
		sleep 0.1
	done
	if [ -n "$port" ]; then break; fi
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	pid=""
done
if [ -z "$port" ]; then
	echo "could not start redis-server on 127.0.0.1" >&2
	exit 1
fi
echo "redis $(redis-server --version | awk '{print $3}') on 127.0.0.1:$port (pid $pid, no persistence)" >&2

status=0
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$bin" -o json bench --redis "127.0.0.1:$port" --plot "$plot" --progress never "$@" >"$out/bench.json" || status=$?
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
# The tables, from the same run's JSON (running again for a table would
# measure another run).
tables="$root/scripts/bench-tables.py"
python3 "$tables" lock "$out/bench.json" >"$out/bench.txt" || true
cat "$out/bench.txt"

if [ "${BENCH_AFFINITY:-1}" != 0 ]; then
	"$bin" -o json bench --strategies stockctl,stockctl-nostep --affinity segment --progress never "$@" \
		>"$out/affinity.json" || status=$?
	python3 "$tables" lock "$out/affinity.json" >"$out/affinity.txt" || true
	cat "$out/affinity.txt"
fi

if [ "${BENCH_SALE:-1}" != 0 ]; then
	echo "sale shapes; load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
	"$bin" -o json bench --sale --redis "127.0.0.1:$port" >"$out/sale.json" || status=$?
	echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
	python3 "$tables" sale "$out/sale.json" >"$out/sale.txt" || true
	cat "$out/sale.txt"
fi

if [ "${BENCH_LIMITS:-0}" != 0 ]; then
	"$bin" -o json bench --sale --sale-shapes limit-1,limit-4,limit-18,limit-64 >"$out/sale-limits.json" || status=$?
	python3 "$tables" sale "$out/sale-limits.json" >"$out/sale-limits.txt" || true
	cat "$out/sale-limits.txt"
fi

if [ "${BENCH_CLUSTER:-1}" != 0 ]; then
	echo "3-member cluster; load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
	"$bin" -o json bench --cluster 3 --strategies one-lock,etcd-mutex,stockctl,stockctl-nostep --progress never "$@" \
		>"$out/cluster3.json" || status=$?
	python3 "$tables" lock "$out/cluster3.json" >"$out/cluster3.txt" || true
	cat "$out/cluster3.txt"
	"$bin" -o json bench --cluster 3 --sale >"$out/sale-cluster3.json" || status=$?
	python3 "$tables" sale "$out/sale-cluster3.json" >"$out/sale-cluster3.txt" || true
	cat "$out/sale-cluster3.txt"
	echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
fi
exit $status
