from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
ERROR_REASON_BODY_TOO_LARGE: ErrorReason
ERROR_REASON_CANCELED: ErrorReason
ERROR_REASON_CONTENTION: ErrorReason
ERROR_REASON_CURSOR_AHEAD: ErrorReason
ERROR_REASON_CURSOR_COMPACTED: ErrorReason
ERROR_REASON_DATA_CORRUPT: ErrorReason
ERROR_REASON_DEADLINE_EXCEEDED: ErrorReason
ERROR_REASON_DELIVERY_CONFLICT: ErrorReason
ERROR_REASON_DELIVERY_UNSUPPORTED: ErrorReason
ERROR_REASON_ETCD_UNAVAILABLE: ErrorReason
ERROR_REASON_HOLD_NOT_FOUND: ErrorReason
ERROR_REASON_INSUFFICIENT_STOCK: ErrorReason
ERROR_REASON_INTERNAL: ErrorReason
ERROR_REASON_INVALID_ARGUMENT: ErrorReason
ERROR_REASON_LIMIT_MISMATCH: ErrorReason
ERROR_REASON_LOCK_BUSY: ErrorReason
ERROR_REASON_LOCK_KIND_UNSUPPORTED: ErrorReason
ERROR_REASON_LOCK_LOST: ErrorReason
ERROR_REASON_ORDER_CONFLICT: ErrorReason
ERROR_REASON_ORDER_NOT_FOUND: ErrorReason
ERROR_REASON_ORDER_PRUNED: ErrorReason
ERROR_REASON_ORDER_STATE_CONFLICT: ErrorReason
ERROR_REASON_OVERLOADED: ErrorReason
ERROR_REASON_PER_USER_LIMIT_EXCEEDED: ErrorReason
ERROR_REASON_RESERVATION_EXPIRED: ErrorReason
ERROR_REASON_SESSION_LOST: ErrorReason
ERROR_REASON_SHUTTING_DOWN: ErrorReason
ERROR_REASON_SKU_EXISTS: ErrorReason
ERROR_REASON_SKU_NOT_FOUND: ErrorReason
ERROR_REASON_TOKEN_INVALID: ErrorReason
ERROR_REASON_TOKEN_IN_URL: ErrorReason
ERROR_REASON_TOKEN_MISSING: ErrorReason
ERROR_REASON_TOO_MANY_HOLDS: ErrorReason
ERROR_REASON_UNSPECIFIED: ErrorReason
LOST_REASON_CALLER_GONE: LostReason
LOST_REASON_KEEPALIVE_TIMEOUT: LostReason
LOST_REASON_SERVER_SHUTDOWN: LostReason
LOST_REASON_SESSION_LOST: LostReason
LOST_REASON_UNSPECIFIED: LostReason

class CursorAhead(_message.Message):
    __slots__ = ["cursor", "revision"]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    cursor: int
    revision: int
    def __init__(self, cursor: _Optional[int] = ..., revision: _Optional[int] = ...) -> None: ...

class CursorCompacted(_message.Message):
    __slots__ = ["compact_revision", "cursor"]
    COMPACT_REVISION_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    compact_revision: int
    cursor: int
    def __init__(self, cursor: _Optional[int] = ..., compact_revision: _Optional[int] = ...) -> None: ...

class InsufficientStock(_message.Message):
    __slots__ = ["remaining", "revision", "sku", "want"]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    WANT_FIELD_NUMBER: _ClassVar[int]
    remaining: int
    revision: int
    sku: str
    want: int
    def __init__(self, sku: _Optional[str] = ..., want: _Optional[int] = ..., remaining: _Optional[int] = ..., revision: _Optional[int] = ...) -> None: ...

class LimitMismatch(_message.Message):
    __slots__ = ["held_limit", "limit", "name"]
    HELD_LIMIT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    held_limit: int
    limit: int
    name: str
    def __init__(self, name: _Optional[str] = ..., limit: _Optional[int] = ..., held_limit: _Optional[int] = ...) -> None: ...

class LockBusy(_message.Message):
    __slots__ = ["name", "wait"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    name: str
    wait: _duration_pb2.Duration
    def __init__(self, name: _Optional[str] = ..., wait: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class LockLost(_message.Message):
    __slots__ = ["message", "name", "reason", "token"]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    message: str
    name: str
    reason: LostReason
    token: int
    def __init__(self, name: _Optional[str] = ..., token: _Optional[int] = ..., reason: _Optional[_Union[LostReason, str]] = ..., message: _Optional[str] = ...) -> None: ...

class OrderPruned(_message.Message):
    __slots__ = ["order", "pruned", "sku"]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    PRUNED_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    order: str
    pruned: _timestamp_pb2.Timestamp
    sku: str
    def __init__(self, sku: _Optional[str] = ..., order: _Optional[str] = ..., pruned: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PerUserLimitExceeded(_message.Message):
    __slots__ = ["buyer", "held", "limit", "revision", "sku", "want"]
    BUYER_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    WANT_FIELD_NUMBER: _ClassVar[int]
    buyer: str
    held: int
    limit: int
    revision: int
    sku: str
    want: int
    def __init__(self, sku: _Optional[str] = ..., buyer: _Optional[str] = ..., limit: _Optional[int] = ..., held: _Optional[int] = ..., want: _Optional[int] = ..., revision: _Optional[int] = ...) -> None: ...

class RefusedLine(_message.Message):
    __slots__ = ["index", "qty", "sku"]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    QTY_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    index: int
    qty: int
    sku: str
    def __init__(self, index: _Optional[int] = ..., sku: _Optional[str] = ..., qty: _Optional[int] = ...) -> None: ...

class ReservationExpired(_message.Message):
    __slots__ = ["deadline", "order", "revision", "sku"]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    deadline: _timestamp_pb2.Timestamp
    order: str
    revision: int
    sku: str
    def __init__(self, sku: _Optional[str] = ..., order: _Optional[str] = ..., deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class LostReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
