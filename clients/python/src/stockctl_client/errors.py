"""stockctl's errors as Python exceptions, one class per reason.

Every error of stockctl serve carries a gRPC code, a message and, in the
``grpc-status-details-bin`` trailer, a ``google.rpc.Status`` whose details
hold a ``google.rpc.ErrorInfo`` (domain ``stockctl``) with the reason to
branch on, plus typed details (``stockctl.v1.InsufficientStock``...).
:func:`from_rpc_error` turns a ``grpc.RpcError`` into the class of its
reason, with the detail's fields as attributes::

    try:
        client.allocate("iphone", "o-1", 2)
    except SoldOut as e:
        print(e.remaining, e.revision)

The classes group under a base per gRPC code (``NotFound``, ``Conflict``,
``FailedPrecondition``, ``Unavailable``...), and an error without an
ErrorInfo (a transport error) becomes that base class.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Type

import grpc

from stockctl.v1 import errors_pb2

from . import rpc_pb2

_TYPE_PREFIX = "type.googleapis.com/"


class StockctlError(Exception):
    """An error answered by stockctl serve (or by gRPC on the way).

    Attributes: ``code`` (a ``grpc.StatusCode``), ``message``, ``reason``
    (the ErrorInfo's reason, e.g. ``"INSUFFICIENT_STOCK"``; ``""`` for a
    transport error), ``metadata`` (the ErrorInfo's), ``retry_delay`` (the
    seconds of a google.rpc.RetryInfo, or None), ``field_violations`` (the
    google.rpc.BadRequest's ``(field, description)`` pairs) and ``details``
    (each detail's bytes by full type name).
    """

    REASON = ""
    CODE = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, *, code: Optional[grpc.StatusCode] = None, reason: Optional[str] = None,
                 metadata: Optional[Dict[str, str]] = None, details: Optional[Dict[str, bytes]] = None,
                 retry_delay: Optional[float] = None, field_violations: Optional[List[tuple]] = None):
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.CODE
        self.reason = reason if reason is not None else self.REASON
        self.metadata = dict(metadata or {})
        self.details = dict(details or {})
        self.retry_delay = retry_delay
        self.field_violations = list(field_violations or [])
        self._parse()

    def detail(self, cls: Type[Any]) -> Optional[Any]:
        """The detail of message class ``cls`` (e.g. errors_pb2.InsufficientStock), or None."""
        raw = self.details.get(cls.DESCRIPTOR.full_name)
        return None if raw is None else cls.FromString(raw)

    def refused_line(self) -> Optional[Any]:
        """The line of an order of several SKUs (allocate_order, reserve_order) that was refused: a
        stockctl.v1.RefusedLine (``index`` in the request's lines from 0, ``sku``, ``qty``), or None. It
        comes with SoldOut and PerUserLimitExceeded, whose attributes are that line's SKU's."""
        return self.detail(errors_pb2.RefusedLine)

    def _parse(self) -> None:
        """Sets the subclass's attributes from its typed detail."""

    def __repr__(self) -> str:
        return "%s(%r, code=%s, reason=%r)" % (type(self).__name__, self.message, self.code.name, self.reason)


def _reason(name: str, base: Type[StockctlError], code: grpc.StatusCode, doc: str,
            detail: Optional[Type[Any]] = None, fields: tuple = ()) -> Type[StockctlError]:
    def parse(self: StockctlError) -> None:
        d = self.detail(detail) if detail is not None else None
        for f in fields:
            if f == "cluster":
                # Of a feed over several clusters: the cluster the cursor's error is of (None: not such a feed).
                self.cluster = self.metadata.get("cluster") or None
            elif f != "reason":
                setattr(self, f, getattr(d, f) if d is not None else None)
        if d is not None and "deadline" in fields:
            self.deadline = d.deadline.ToDatetime() if d.HasField("deadline") else None
        if d is not None and "pruned" in fields:
            self.pruned = d.pruned.ToDatetime() if d.HasField("pruned") else None
        if d is not None and "wait" in fields:
            self.wait = d.wait.ToTimedelta() if d.HasField("wait") else None
        if "reason" in fields:
            # LockLost's reason is a LostReason, without its prefix: .reason stays the ErrorInfo's.
            lost = self.metadata.get("reason", "")
            if d is not None:
                lost = errors_pb2.LostReason.Name(d.reason)
            if not getattr(self, "lost_reason", None):
                self.lost_reason = lost.replace("LOST_REASON_", "") or None
    return type(_class_name(name), (base,), {"REASON": name, "CODE": code, "__doc__": doc, "_parse": parse,
                                             "__module__": __name__})


def _class_name(reason: str) -> str:
    return _NAMES.get(reason) or "".join(w.capitalize() for w in reason.split("_"))


_NAMES = {"INSUFFICIENT_STOCK": "SoldOut", "SKU_EXISTS": "SKUExists", "SKU_NOT_FOUND": "SKUNotFound"}

C = grpc.StatusCode


# The bases, one per gRPC code: an error without an ErrorInfo is one of these.
class InvalidArgument(StockctlError):
    """INVALID_ARGUMENT: a field is malformed or out of range; nothing changed. ``field`` names it."""
    REASON, CODE = "INVALID_ARGUMENT", C.INVALID_ARGUMENT

    def _parse(self) -> None:
        self.field = self.metadata.get("field") or (self.field_violations[0][0] if self.field_violations else None)


class NotFound(StockctlError):
    """NOT_FOUND."""
    CODE = C.NOT_FOUND


class Conflict(StockctlError):
    """ALREADY_EXISTS: the ID was used before, with other values."""
    CODE = C.ALREADY_EXISTS


class FailedPrecondition(StockctlError):
    """FAILED_PRECONDITION: refused in the current state; nothing changed."""
    CODE = C.FAILED_PRECONDITION


class Aborted(StockctlError):
    """ABORTED."""
    CODE = C.ABORTED


class ResourceExhausted(StockctlError):
    """RESOURCE_EXHAUSTED: a bound of the server."""
    CODE = C.RESOURCE_EXHAUSTED


class Unauthenticated(StockctlError):
    """UNAUTHENTICATED: no or a wrong bearer token."""
    CODE = C.UNAUTHENTICATED


class PermissionDenied(StockctlError):
    """PERMISSION_DENIED."""
    CODE = C.PERMISSION_DENIED


class Unavailable(StockctlError):
    """UNAVAILABLE: retry (the client does, with the same order ID, on another server if it has one)."""
    CODE = C.UNAVAILABLE


class Unimplemented(StockctlError):
    """UNIMPLEMENTED."""
    CODE = C.UNIMPLEMENTED


class OutOfRange(StockctlError):
    """OUT_OF_RANGE."""
    CODE = C.OUT_OF_RANGE


class Unknown(StockctlError):
    """UNKNOWN."""
    CODE = C.UNKNOWN


E = errors_pb2
TokenInURL = _reason("TOKEN_IN_URL", InvalidArgument, C.INVALID_ARGUMENT, "A credential in the URL's query.")
CursorAhead = _reason("CURSOR_AHEAD", InvalidArgument, C.INVALID_ARGUMENT,
                      "WatchOrders' since is ahead of etcd's revision (another etcd): start again with a snapshot. "
                      "On a merged feed (several clusters) ``cluster`` names the cluster, and ``cursor`` is its revision.",
                      E.CursorAhead, ("cursor", "revision", "cluster"))


class MergedCursorRefused(InvalidArgument):
    """A merged feed's cursor (``merged_since``) refused because of one cluster, named in ``cluster``:
    one the server does not have (another fleet's), or one removed from the fleet whose order feed's
    end the cursor has not reached (or does not name): its events would be skipped. The message says
    what to do (read the removed cluster's last events with a feed of it alone, then set it at its end
    in the cursor; docs/deploy.md, removing a cluster).

    The server says INVALID_ARGUMENT on field ``merged_since`` with the ErrorInfo metadata ``cluster``;
    :func:`from_status` gives that this class (``reason`` stays ``"INVALID_ARGUMENT"``)."""

    def _parse(self) -> None:
        InvalidArgument._parse(self)
        self.cluster = self.metadata.get("cluster") or None


SKUNotFound = _reason("SKU_NOT_FOUND", NotFound, C.NOT_FOUND, "No such SKU (or its creation has not completed).")
OrderNotFound = _reason("ORDER_NOT_FOUND", NotFound, C.NOT_FOUND, "No such order of this SKU.")
HoldNotFound = _reason("HOLD_NOT_FOUND", NotFound, C.NOT_FOUND, "No live hold with this ID on this server.")
SKUExists = _reason("SKU_EXISTS", Conflict, C.ALREADY_EXISTS, "CreateSKU of an existing SKU.")
OrderConflict = _reason("ORDER_CONFLICT", Conflict, C.ALREADY_EXISTS,
                        "The order ID was used with another SKU, qty, buyer or kind of order.")
DeliveryConflict = _reason("DELIVERY_CONFLICT", Conflict, C.ALREADY_EXISTS,
                           "Restock's delivery ID was used with another SKU or qty; nothing added.")
OrderStateConflict = _reason("ORDER_STATE_CONFLICT", FailedPrecondition, C.FAILED_PRECONDITION,
                             "Confirm or Cancel of an order in a state that does not allow it.")
SoldOut = _reason("INSUFFICIENT_STOCK", FailedPrecondition, C.FAILED_PRECONDITION,
                  "Sold out: the whole SKU held less than ``want`` (``remaining``) at ``revision``; nothing deducted.",
                  E.InsufficientStock, ("sku", "want", "remaining", "revision"))
InsufficientStock = SoldOut
PerUserLimitExceeded = _reason("PER_USER_LIMIT_EXCEEDED", FailedPrecondition, C.FAILED_PRECONDITION,
                               "The order would take the buyer past the SKU's per-user limit.",
                               E.PerUserLimitExceeded, ("sku", "buyer", "limit", "held", "want", "revision"))
ReservationExpired = _reason("RESERVATION_EXPIRED", FailedPrecondition, C.FAILED_PRECONDITION,
                             "The reservation passed its deadline; its units went back.",
                             E.ReservationExpired, ("sku", "order", "deadline", "revision"))
OrderPruned = _reason("ORDER_PRUNED", FailedPrecondition, C.FAILED_PRECONDITION,
                      "The order was applied, then archived by prune, which keeps its ID for a retention "
                      "(24 h by default): a retry is refused, never applied twice; ``pruned`` says when.",
                      E.OrderPruned, ("sku", "order", "pruned"))
LockLost = _reason("LOCK_LOST", FailedPrecondition, C.FAILED_PRECONDITION,
                   "The hold was lost (``lost_reason``: SESSION_LOST, KEEPALIVE_TIMEOUT, SERVER_SHUTDOWN, or "
                   "STREAM_BROKEN when the client saw its stream break); someone else may hold the lock now.",
                   E.LockLost, ("name", "token", "reason"))
CursorCompacted = _reason("CURSOR_COMPACTED", FailedPrecondition, C.FAILED_PRECONDITION,
                          "WatchOrders' since is older than etcd's compacted history: start again with a snapshot. "
                          "On a merged feed (several clusters) ``cluster`` names the compacted cluster, and "
                          "``cursor`` is its revision.",
                          E.CursorCompacted, ("cursor", "compact_revision", "cluster"))
LimitMismatch = _reason("LIMIT_MISMATCH", FailedPrecondition, C.FAILED_PRECONDITION,
                        "A semaphore permit asked with another limit than its holders'.",
                        E.LimitMismatch, ("name", "limit", "held_limit"))
LockBusy = _reason("LOCK_BUSY", Aborted, C.ABORTED, "The lock stayed held for the whole wait.",
                   E.LockBusy, ("name", "wait"))
Contention = _reason("CONTENTION", Aborted, C.ABORTED,
                     "A commit kept losing to other writers for the whole deadline; nothing written. Retried.")
Overloaded = _reason("OVERLOADED", ResourceExhausted, C.RESOURCE_EXHAUSTED,
                     "The server is at its bound of calls in flight. Retried, on another server if any.")
TooManyHolds = _reason("TOO_MANY_HOLDS", ResourceExhausted, C.RESOURCE_EXHAUSTED,
                       "The server keeps its maximum of unary holds.")
BodyTooLarge = _reason("BODY_TOO_LARGE", ResourceExhausted, C.RESOURCE_EXHAUSTED, "The request is larger than the limit.")
TokenMissing = _reason("TOKEN_MISSING", Unauthenticated, C.UNAUTHENTICATED, "No bearer token.")
TokenInvalid = _reason("TOKEN_INVALID", Unauthenticated, C.UNAUTHENTICATED, "A token the server does not accept.")
EtcdUnavailable = _reason("ETCD_UNAVAILABLE", Unavailable, C.UNAVAILABLE, "etcd unreachable. Retried.")
SessionLost = _reason("SESSION_LOST", Unavailable, C.UNAVAILABLE,
                      "The server's etcd session ended during the call; nothing committed. Retried.")
ShuttingDown = _reason("SHUTTING_DOWN", Unavailable, C.UNAVAILABLE, "The server is stopping. Retried elsewhere.")
DataCorrupt = _reason("DATA_CORRUPT", StockctlError, C.DATA_LOSS, "A value in etcd does not decode: page the operator.")
DeadlineExceeded = _reason("DEADLINE_EXCEEDED", StockctlError, C.DEADLINE_EXCEEDED,
                           "The deadline passed first; an order may still have been committed: retry with its ID.")
Canceled = _reason("CANCELED", StockctlError, C.CANCELLED, "The call was cancelled.")
DeliveryUnsupported = _reason("DELIVERY_UNSUPPORTED", Unimplemented, C.UNIMPLEMENTED, "No longer sent.")
LockKindUnsupported = _reason("LOCK_KIND_UNSUPPORTED", Unimplemented, C.UNIMPLEMENTED,
                              "A lock kind this server does not know.")
Internal = _reason("INTERNAL", StockctlError, C.INTERNAL, "Anything else; the message says what.")

del E

#: The class of each ErrorInfo reason.
BY_REASON: Dict[str, Type[StockctlError]] = {cls.REASON: cls for cls in [
    InvalidArgument, TokenInURL, CursorAhead, SKUNotFound, OrderNotFound, HoldNotFound, SKUExists, OrderConflict,
    DeliveryConflict, OrderStateConflict, SoldOut, PerUserLimitExceeded, ReservationExpired, OrderPruned, LockLost,
    CursorCompacted, LimitMismatch, LockBusy, Contention, Overloaded, TooManyHolds, BodyTooLarge, TokenMissing,
    TokenInvalid, EtcdUnavailable, SessionLost, ShuttingDown, DataCorrupt, DeadlineExceeded, Canceled,
    DeliveryUnsupported, LockKindUnsupported, Internal]}

#: The class of an error without an ErrorInfo, by its gRPC code.
BY_CODE: Dict[grpc.StatusCode, Type[StockctlError]] = {
    C.INVALID_ARGUMENT: InvalidArgument, C.NOT_FOUND: NotFound, C.ALREADY_EXISTS: Conflict,
    C.FAILED_PRECONDITION: FailedPrecondition, C.ABORTED: Aborted, C.RESOURCE_EXHAUSTED: ResourceExhausted,
    C.UNAUTHENTICATED: Unauthenticated, C.PERMISSION_DENIED: PermissionDenied, C.UNAVAILABLE: Unavailable,
    C.UNIMPLEMENTED: Unimplemented, C.OUT_OF_RANGE: OutOfRange, C.DATA_LOSS: DataCorrupt,
    C.DEADLINE_EXCEEDED: DeadlineExceeded, C.CANCELLED: Canceled, C.INTERNAL: Internal, C.UNKNOWN: Unknown,
}

del C


def from_status(code: grpc.StatusCode, message: str, status_bytes: Optional[bytes]) -> StockctlError:
    """The exception of a gRPC status: its code, message and the bytes of the
    grpc-status-details-bin trailer (a google.rpc.Status), if any."""
    details: Dict[str, bytes] = {}
    if status_bytes:
        st = rpc_pb2.Status.FromString(status_bytes)
        message = st.message or message
        for d in st.details:
            name = d.type_url[len(_TYPE_PREFIX):] if d.type_url.startswith(_TYPE_PREFIX) else d.type_url.rsplit("/", 1)[-1]
            details[name] = d.value
    reason, metadata, retry_delay, violations = "", {}, None, []
    if "google.rpc.ErrorInfo" in details:
        info = rpc_pb2.ErrorInfo.FromString(details["google.rpc.ErrorInfo"])
        if info.domain in ("stockctl", ""):
            reason, metadata = info.reason, dict(info.metadata)
    if "google.rpc.RetryInfo" in details:
        retry_delay = rpc_pb2.RetryInfo.FromString(details["google.rpc.RetryInfo"]).retry_delay.ToTimedelta().total_seconds()
    if "google.rpc.BadRequest" in details:
        br = rpc_pb2.BadRequest.FromString(details["google.rpc.BadRequest"])
        violations = [(v.field, v.description) for v in br.field_violations]
    cls = BY_REASON.get(reason) or BY_CODE.get(code, StockctlError)
    if cls is InvalidArgument and metadata.get("field") == "merged_since" and metadata.get("cluster"):
        cls = MergedCursorRefused
    return cls(message, code=code, reason=reason, metadata=metadata, details=details, retry_delay=retry_delay,
               field_violations=violations)


def from_rpc_error(err: grpc.RpcError) -> StockctlError:
    """The exception of a grpc.RpcError raised by a call (a grpc.Call)."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else str(err)
    raw = None
    if hasattr(err, "trailing_metadata"):
        for key, value in err.trailing_metadata() or ():
            if key == "grpc-status-details-bin":
                raw = value
    exc = from_status(code, message or "", raw)
    exc.__cause__ = err
    return exc
