"""The serves a live test runs against, from the environment the Go test
clients/TestPythonClient sets (it starts them): STOCKCTL_TARGET (serve A,
on an embedded etcd), STOCKCTL_SPARE_TARGET and STOCKCTL_SPARE_PID (serve
B, on A's etcd, which a test kills), STOCKCTL_TOKEN, STOCKCTL_COMPACTED (a
revision up to which A's etcd compacted its history), STOCKCTL_PRUNED_SKU
(a SKU whose one order, "gone", was archived by prune).

Over two etcd clusters, "a" and "b": STOCKCTL_MERGED_TARGET (a serve over
both) and STOCKCTL_MERGED_SPARE_TARGET with STOCKCTL_MERGED_SPARE_PID
(another, which a test kills), STOCKCTL_MERGED_SKU_A and _B (a SKU created
in each cluster), STOCKCTL_MERGED_COMPACTED_A (a revision up to which
cluster a compacted its history)."""

import os
import uuid

TARGET = os.environ.get("STOCKCTL_TARGET", "")
SPARE = os.environ.get("STOCKCTL_SPARE_TARGET", "")
SPARE_PID = int(os.environ.get("STOCKCTL_SPARE_PID", "0"))
TOKEN = os.environ.get("STOCKCTL_TOKEN", "")
COMPACTED = int(os.environ.get("STOCKCTL_COMPACTED", "0"))
PRUNED_SKU = os.environ.get("STOCKCTL_PRUNED_SKU", "")
MERGED = os.environ.get("STOCKCTL_MERGED_TARGET", "")
MERGED_SPARE = os.environ.get("STOCKCTL_MERGED_SPARE_TARGET", "")
MERGED_SPARE_PID = int(os.environ.get("STOCKCTL_MERGED_SPARE_PID", "0"))
SKU_A = os.environ.get("STOCKCTL_MERGED_SKU_A", "")
SKU_B = os.environ.get("STOCKCTL_MERGED_SKU_B", "")
COMPACTED_A = int(os.environ.get("STOCKCTL_MERGED_COMPACTED_A", "0"))


def need():
    if not TARGET:
        raise RuntimeError("STOCKCTL_TARGET is not set: run these tests with `go test ./clients/`, "
                           "which starts the serves they need")


def name(prefix):
    """A name no other test or run uses."""
    return "%s-%s" % (prefix, uuid.uuid4().hex[:10])
