#!/usr/bin/env bash
# bench-redis.sh: stockctl bench's full comparison, Redis peers included.
#
# Installs Debian's redis-server if it is missing, starts a throwaway one on
# 127.0.0.1 (a free port, no persistence, in a temporary directory), builds
# the benchredis module's binary (stockctl with the Redis strategies), runs
# every strategy at every shape (by default a single lock and the main
# table: --runs 1x2,20x40,20x200,100x200) on an embedded etcd (fsync on),
# then stockctl alone with --affinity segment, then the sale shapes (bench
# --sale: sell-out storms, releases racing them, many SKUs) with redis-lua,
# then the main table and the sale shapes of the etcd strategies on a
# 3-member embedded cluster (what replication costs), and stops Redis
# whatever happens.
#
#   scripts/bench-redis.sh [stockctl bench flags...]
#
# Results: $BENCH_OUT (default /tmp/stockctl-bench) gets bench.json,
# bench.txt (the table), affinity.txt, sale.json, sale.txt, cluster3.txt,
# sale-cluster3.txt and redis.log; the plot goes to $BENCH_PLOT (default
# docs/benchmarks.svg). BENCH_AFFINITY=0, BENCH_SALE=0 and BENCH_CLUSTER=0
# skip those runs. The flags given are passed to the lock-shape runs only.
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
# The table, from the same run's JSON (running again for a table would
# measure another run).
python3 - "$out/bench.json" >"$out/bench.txt" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
print("machine:", r["machine"])
print("config:", r["config"])
print("runs (segments x buyers):", ", ".join("%dx%d" % (s["segments"], s["buyers"]) for s in r["config"]["runs"]))
h = "strategy segments buyers orders orders/s ideal of-ideal p50 p99 max service-p99 refills refill-p99 per-buyer oversold ok".split()
print(" | ".join(h))
for x in r["rows"]:
    # refills/refillMs are null for strategies without a pool; refillMs
    # also when no refill was seen.
    refills = "-" if x.get("refills") is None else x["refills"]
    refill_p99 = "-" if x.get("refillMs") is None else round(x["refillMs"]["p99"], 1)
    print(" | ".join(str(v) for v in [x["strategy"], x["segments"], x["buyers"], x["orders"], round(x["ordersPerSec"]),
        round(x["idealPerSec"]), round(x["ofIdeal"], 2), round(x["latencyMs"]["p50"], 1), round(x["latencyMs"]["p99"], 1),
        round(x["latencyMs"]["max"], 1), round(x["serviceMs"]["p99"], 1), refills, refill_p99,
        "%d-%d" % (x["ordersPerBuyer"]["min"], x["ordersPerBuyer"]["max"]), x["oversold"], x["ok"]]))
for t in r["targets"]:
    print("TARGET", t["name"], "|", t["status"], "|", t["detail"])
for f in r["failures"]:
    print("FAILED", f)
PY
cat "$out/bench.txt"

if [ "${BENCH_AFFINITY:-1}" != 0 ]; then
	"$bin" bench --strategies stockctl,stockctl-nostep --affinity segment --progress never "$@" \
		>"$out/affinity.txt" 2>&1 || status=$?
	cat "$out/affinity.txt"
fi

if [ "${BENCH_SALE:-1}" != 0 ]; then
	echo "sale shapes; load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
	"$bin" -o json bench --sale --redis "127.0.0.1:$port" >"$out/sale.json" || status=$?
	echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
	python3 - "$out/sale.json" >"$out/sale.txt" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
print("machine:", r["machine"])
print("config:", r["config"])
h = "shape strategy skus stock orders/s refusals/s served-p99 refusal-p50 refusal-p99 releases errors truth etcd-w/order etcd-r/order goroutines heap-MiB ok".split()
print(" | ".join(h))
for x in r["rows"]:
    n = x["orders"] + x["refusals"]
    e = x.get("etcd")
    w = "-" if not e or n == 0 else "%.3f" % (e["writes"] / n)
    rd = "-" if not e or n == 0 else "%.3f" % (e["reads"] / n)
    truth = "-" if x["truthChecked"] == 0 else "%d/%d untrue" % (x["untrue"], x["truthChecked"])
    print(" | ".join(str(v) for v in [x["shape"]["name"], x["strategy"], x["shape"]["skus"], x["shape"]["stock"],
        round(x["ordersPerSec"]), round(x["refusalsPerSec"]), round(x["servedMs"]["p99"], 1), round(x["refusalMs"]["p50"], 1),
        round(x["refusalMs"]["p99"], 1), x["releases"], x["errors"], truth, w, rd, x["goroutines"], round(x["heapMiB"]), x["ok"]]))
for t in r["targets"]:
    print("TARGET", t["name"], "|", t["status"], "|", t["detail"])
for f in r["failures"]:
    print("FAILED", f)
PY
	cat "$out/sale.txt"
fi

if [ "${BENCH_CLUSTER:-1}" != 0 ]; then
	echo "3-member cluster; load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
	"$bin" bench --cluster 3 --strategies one-lock,etcd-mutex,stockctl,stockctl-nostep --progress never "$@" \
		>"$out/cluster3.txt" 2>&1 || status=$?
	cat "$out/cluster3.txt"
	"$bin" bench --cluster 3 --sale >"$out/sale-cluster3.txt" 2>&1 || status=$?
	cat "$out/sale-cluster3.txt"
	echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
fi
exit $status
