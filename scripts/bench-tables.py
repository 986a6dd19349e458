#!/usr/bin/env python3
"""bench-tables.py: Markdown tables from stockctl bench's JSON (-o json).

    scripts/bench-tables.py lock bench.json    # the lock shapes: rows, refills, targets
    scripts/bench-tables.py sale sale.json     # bench --sale: rows, targets

docs/benchmarks.md's tables are this script's output for the run they
describe, so every figure there comes from a file a run wrote.
"""
import json
import sys


def fmt(v, nd=1):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def table(header, rows, right=()):
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def targets(r):
    rows = [[t["name"], "**" + t["status"] + "**", t["detail"]] for t in r.get("targets", [])]
    out = table(["target", "verdict", "figures"], rows)
    for f in r.get("failures", []):
        out += "\nFAILED: " + f
    return out


def lock(r):
    head = ["strategy", "segments", "buyers", "orders", "orders/s", "ideal/s", "of ideal", "p50 ms", "p99 ms",
            "max ms", "service p99 ms", "refills", "refill p99 ms", "per buyer", "oversold", "check"]
    rows = []
    for x in r["rows"]:
        ideal = x.get("idealPerSec") or 0
        rows.append([x["strategy"], x["segments"], x["buyers"], x["orders"], "**%s**" % fmt(round(x["ordersPerSec"])),
                     fmt(round(ideal)) if ideal else "–", fmt(x["ofIdeal"], 2) if ideal else "–",
                     fmt(x["latencyMs"]["p50"]), fmt(x["latencyMs"]["p99"]), fmt(x["latencyMs"]["max"]),
                     fmt(x["serviceMs"]["p99"]) if ideal else "–",
                     "–" if x.get("refills") is None else x["refills"],
                     "–" if not x.get("refillMs") else fmt(x["refillMs"]["p99"]),
                     "%d–%d" % (x["ordersPerBuyer"]["min"], x["ordersPerBuyer"]["max"]), x["oversold"],
                     "ok" if x["ok"] else "FAILED"])
    print(table(head, rows, right=range(1, 15)))
    print()
    ref = []
    for x in r["rows"]:
        if x.get("refills") is None:
            continue
        m = x.get("refillMs") or {}
        ref.append([x["strategy"], "%d × %d" % (x["segments"], x["buyers"]), x["refills"], fmt(m.get("p50")),
                    fmt(m.get("p99")), fmt(m.get("max")), x.get("refillsPending", 0)])
    if ref:
        print(table(["strategy", "shape", "refills", "p50 ms", "p99 ms", "max ms", "pending"], ref, right=range(2, 7)))
        print()
    print(targets(r))


def ratio(v, nd=2):
    return "–" if v is None else f"{v:,.{nd}f}"


def sale(r):
    head = ["shape", "strategy", "SKUs", "stock", "orders/s", "refusals/s", "served p99 ms", "refusal p50 ms",
            "refusal p99 ms", "releases", "failed", "untrue refusals", "etcd writes/order", "etcd reads/order",
            "goroutines", "heap MiB", "check"]
    rows = []
    for x in r["rows"]:
        n = x["orders"] + x["refusals"]
        e = x.get("etcd")
        w = "–" if not e or n == 0 else "%.3f" % (e["writes"] / n)
        rd = "–" if not e or n == 0 else "%.3f" % (e["reads"] / n)
        truth = "–" if x["truthChecked"] == 0 else "%d of %s" % (x["untrue"], fmt(x["truthChecked"]))
        limit = x["shape"].get("batch", 0) > 0
        stock = "–" if limit else "plenty" if x["shape"]["stock"] >= 1 << 40 else fmt(x["shape"]["stock"])
        rows.append([x["shape"]["name"], x["strategy"], "–" if limit else fmt(x["shape"]["skus"]), stock,
                     "**%s**" % fmt(round(x["ordersPerSec"])), "**%s**" % fmt(round(x["refusalsPerSec"])),
                     fmt(x["servedMs"]["p99"]) if x["orders"] else "–",
                     fmt(x["refusalMs"]["p50"]) if x["refusals"] else "–",
                     fmt(x["refusalMs"]["p99"]) if x["refusals"] else "–",
                     fmt(x["releases"]), x["errors"] + x.get("unresolved", 0), truth, w, rd, fmt(x["goroutines"]),
                     fmt(round(x["heapMiB"])), "ok" if x["ok"] else "FAILED"])
    print(table(head, rows, right=range(2, 16)))
    print()
    # What a served order cost etcd: etcd's own counts (keys, deletes,
    # applied writes) and the clients' (compares, write requests, refused).
    head = ["shape", "strategy", "orders/s", "keys/order (etcd)", "deletes/order (etcd)", "compares/order (client)",
            "txns/order (client)", "orders/commit (etcd)", "refused commits (client)", "etcd puts", "etcd writes",
            "etcd_mvcc_txn_total"]
    rows = []
    for x in r["rows"]:
        c, sv = x.get("costs") or {}, x.get("etcdServer")
        if not x.get("etcd") and not sv:
            continue
        refused = c.get("refusedCommits")
        rows.append([x["shape"]["name"], x["strategy"], "**%s**" % fmt(round(x["ordersPerSec"])),
                     "**%s**" % ratio(c.get("keysPerOrder")), ratio(c.get("deletesPerOrder")),
                     ratio(c.get("comparesPerOrder")), ratio(c.get("txnsPerOrder"), 3), ratio(c.get("ordersPerCommit"), 1),
                     "–" if refused is None else "%.1f %%" % (100 * refused),
                     fmt(sv["puts"]) if sv else "–", fmt(sv["writes"]) if sv else "–", fmt(sv["mvccTxns"]) if sv else "–"])
    if rows:
        print(table(head, rows, right=range(2, 12)))
        print()
    print(targets(r))


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("lock", "sale"):
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    r = json.load(open(sys.argv[2]))
    print("machine:", r.get("machine"))
    print("config:", r.get("config"))
    print()
    {"lock": lock, "sale": sale}[sys.argv[1]](r)


if __name__ == "__main__":
    main()
