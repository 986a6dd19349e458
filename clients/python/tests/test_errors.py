"""Every ErrorReason maps to its own exception class, with its detail's fields (no server needed)."""

import unittest

import grpc
from google.protobuf import any_pb2, duration_pb2, timestamp_pb2

import stockctl_client as sc
from stockctl.v1 import errors_pb2
from stockctl_client import rpc_pb2


def status_bytes(code, reason, *details, metadata=None):
    st = rpc_pb2.Status(code=code.value[0], message="m " + reason)
    info = rpc_pb2.ErrorInfo(reason=reason, domain="stockctl", metadata=metadata or {})
    for m, name in [(info, "google.rpc.ErrorInfo")] + [(d, d.DESCRIPTOR.full_name) for d in details]:
        st.details.append(any_pb2.Any(type_url="type.googleapis.com/" + name, value=m.SerializeToString()))
    return st.SerializeToString()


class ErrorMapping(unittest.TestCase):
    def test_every_reason_has_its_class(self):
        reasons = [n[len("ERROR_REASON_"):] for n in errors_pb2.ErrorReason.keys() if n != "ERROR_REASON_UNSPECIFIED"]
        self.assertEqual(len(reasons), 32)
        seen = set()
        for r in reasons:
            cls = sc.BY_REASON.get(r)
            self.assertIsNotNone(cls, "no exception class for reason %s" % r)
            self.assertNotIn(cls, seen, "two reasons share %s" % cls.__name__)
            seen.add(cls)
            err = sc.from_status(cls.CODE, "", status_bytes(cls.CODE, r))
            self.assertIs(type(err), cls, r)
            self.assertEqual(err.reason, r)
            self.assertEqual(err.code, cls.CODE)
            self.assertEqual(err.message, "m " + r)
            self.assertIsInstance(err, sc.StockctlError)

    def test_typed_details(self):
        C = grpc.StatusCode
        e = sc.from_status(C.FAILED_PRECONDITION, "", status_bytes(
            C.FAILED_PRECONDITION, "INSUFFICIENT_STOCK", errors_pb2.InsufficientStock(sku="s", want=5, remaining=1, revision=19)))
        self.assertIsInstance(e, sc.SoldOut)
        self.assertIsInstance(e, sc.FailedPrecondition)
        self.assertEqual((e.sku, e.want, e.remaining, e.revision), ("s", 5, 1, 19))
        e = sc.from_status(C.FAILED_PRECONDITION, "", status_bytes(
            C.FAILED_PRECONDITION, "PER_USER_LIMIT_EXCEEDED",
            errors_pb2.PerUserLimitExceeded(sku="s", buyer="b", limit=2, held=2, want=1, revision=7)))
        self.assertEqual((e.buyer, e.limit, e.held, e.want, e.revision), ("b", 2, 2, 1, 7))
        e = sc.from_status(C.FAILED_PRECONDITION, "", status_bytes(
            C.FAILED_PRECONDITION, "RESERVATION_EXPIRED",
            errors_pb2.ReservationExpired(sku="s", order="o", deadline=timestamp_pb2.Timestamp(seconds=100), revision=3)))
        self.assertEqual((e.order, e.deadline.timestamp(), e.revision), ("o", 100, 3))
        e = sc.from_status(C.FAILED_PRECONDITION, "", status_bytes(
            C.FAILED_PRECONDITION, "LOCK_LOST",
            errors_pb2.LockLost(name="n", token=9, reason=errors_pb2.LOST_REASON_KEEPALIVE_TIMEOUT)))
        self.assertEqual((e.name, e.token, e.lost_reason, e.reason), ("n", 9, "KEEPALIVE_TIMEOUT", "LOCK_LOST"))
        e = sc.from_status(C.ABORTED, "", status_bytes(
            C.ABORTED, "LOCK_BUSY", errors_pb2.LockBusy(name="n", wait=duration_pb2.Duration(seconds=2))))
        self.assertEqual((e.name, e.wait.total_seconds()), ("n", 2))
        e = sc.from_status(C.FAILED_PRECONDITION, "", status_bytes(
            C.FAILED_PRECONDITION, "LIMIT_MISMATCH", errors_pb2.LimitMismatch(name="n", limit=4, held_limit=3)))
        self.assertEqual((e.limit, e.held_limit), (4, 3))
        e = sc.from_status(C.FAILED_PRECONDITION, "", status_bytes(
            C.FAILED_PRECONDITION, "CURSOR_COMPACTED", errors_pb2.CursorCompacted(cursor=5, compact_revision=9)))
        self.assertEqual((e.cursor, e.compact_revision), (5, 9))
        e = sc.from_status(C.INVALID_ARGUMENT, "", status_bytes(
            C.INVALID_ARGUMENT, "CURSOR_AHEAD", errors_pb2.CursorAhead(cursor=50, revision=9)))
        self.assertEqual((e.cursor, e.revision), (50, 9))
        e = sc.from_status(C.INVALID_ARGUMENT, "", status_bytes(C.INVALID_ARGUMENT, "INVALID_ARGUMENT",
                                                                 metadata={"field": "qty"}))
        self.assertEqual(e.field, "qty")
        retry = rpc_pb2.RetryInfo(retry_delay=duration_pb2.Duration(nanos=100000000))
        st = rpc_pb2.Status.FromString(status_bytes(C.RESOURCE_EXHAUSTED, "OVERLOADED"))
        st.details.append(any_pb2.Any(type_url="type.googleapis.com/google.rpc.RetryInfo", value=retry.SerializeToString()))
        e = sc.from_status(C.RESOURCE_EXHAUSTED, "", st.SerializeToString())
        self.assertIsInstance(e, sc.Overloaded)
        self.assertAlmostEqual(e.retry_delay, 0.1)
        self.assertTrue(sc.retryable(e))

    def test_without_error_info_by_code(self):
        e = sc.from_status(grpc.StatusCode.UNAVAILABLE, "connection refused", None)
        self.assertIs(type(e), sc.Unavailable)
        self.assertEqual(e.reason, "")
        self.assertTrue(sc.retryable(e))
        self.assertFalse(sc.retryable(sc.from_status(grpc.StatusCode.FAILED_PRECONDITION, "", None)))
        self.assertIs(type(sc.from_status(grpc.StatusCode.DEADLINE_EXCEEDED, "", None)), sc.DeadlineExceeded)


if __name__ == "__main__":
    unittest.main()
