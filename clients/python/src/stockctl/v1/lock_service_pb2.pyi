from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from stockctl.v1 import errors_pb2 as _errors_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
LOCK_KIND_EXCLUSIVE: LockKind
LOCK_KIND_SEMAPHORE: LockKind
LOCK_KIND_SHARED: LockKind
LOCK_KIND_UNSPECIFIED: LockKind

class AcquireRequest(_message.Message):
    __slots__ = ["kind", "limit", "name", "request_id", "ttl", "wait"]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    kind: LockKind
    limit: int
    name: str
    request_id: str
    ttl: _duration_pb2.Duration
    wait: _duration_pb2.Duration
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[LockKind, str]] = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., wait: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., limit: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ["expire_time", "hold_id", "key", "kind", "limit", "name", "replayed", "revision", "token", "ttl"]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    HOLD_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    expire_time: _timestamp_pb2.Timestamp
    hold_id: str
    key: str
    kind: LockKind
    limit: int
    name: str
    replayed: bool
    revision: int
    token: int
    ttl: _duration_pb2.Duration
    def __init__(self, hold_id: _Optional[str] = ..., name: _Optional[str] = ..., kind: _Optional[_Union[LockKind, str]] = ..., token: _Optional[int] = ..., key: _Optional[str] = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., expire_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., limit: _Optional[int] = ..., revision: _Optional[int] = ..., replayed: bool = ...) -> None: ...

class HoldAcquire(_message.Message):
    __slots__ = ["kind", "limit", "name", "ttl", "wait"]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    kind: LockKind
    limit: int
    name: str
    ttl: _duration_pb2.Duration
    wait: _duration_pb2.Duration
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[LockKind, str]] = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., wait: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., limit: _Optional[int] = ...) -> None: ...

class HoldAcquired(_message.Message):
    __slots__ = ["key", "kind", "limit", "name", "revision", "token", "ttl"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    key: str
    kind: LockKind
    limit: int
    name: str
    revision: int
    token: int
    ttl: _duration_pb2.Duration
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[LockKind, str]] = ..., token: _Optional[int] = ..., key: _Optional[str] = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., limit: _Optional[int] = ..., revision: _Optional[int] = ...) -> None: ...

class HoldKeepAlive(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class HoldRelease(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class HoldReleased(_message.Message):
    __slots__ = ["name", "token"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    token: int
    def __init__(self, name: _Optional[str] = ..., token: _Optional[int] = ...) -> None: ...

class HoldRequest(_message.Message):
    __slots__ = ["acquire", "keep_alive", "release"]
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    acquire: HoldAcquire
    keep_alive: HoldKeepAlive
    release: HoldRelease
    def __init__(self, acquire: _Optional[_Union[HoldAcquire, _Mapping]] = ..., keep_alive: _Optional[_Union[HoldKeepAlive, _Mapping]] = ..., release: _Optional[_Union[HoldRelease, _Mapping]] = ...) -> None: ...

class HoldResponse(_message.Message):
    __slots__ = ["acquired", "lost", "released"]
    ACQUIRED_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    acquired: HoldAcquired
    lost: _errors_pb2.LockLost
    released: HoldReleased
    def __init__(self, acquired: _Optional[_Union[HoldAcquired, _Mapping]] = ..., released: _Optional[_Union[HoldReleased, _Mapping]] = ..., lost: _Optional[_Union[_errors_pb2.LockLost, _Mapping]] = ...) -> None: ...

class KeepAliveRequest(_message.Message):
    __slots__ = ["hold_id"]
    HOLD_ID_FIELD_NUMBER: _ClassVar[int]
    hold_id: str
    def __init__(self, hold_id: _Optional[str] = ...) -> None: ...

class KeepAliveResponse(_message.Message):
    __slots__ = ["expire_time", "hold_id", "token", "ttl"]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    HOLD_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    expire_time: _timestamp_pb2.Timestamp
    hold_id: str
    token: int
    ttl: _duration_pb2.Duration
    def __init__(self, hold_id: _Optional[str] = ..., token: _Optional[int] = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., expire_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class LockServiceReleaseRequest(_message.Message):
    __slots__ = ["hold_id", "request_id"]
    HOLD_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    hold_id: str
    request_id: str
    def __init__(self, hold_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class LockServiceReleaseResponse(_message.Message):
    __slots__ = ["hold_id", "name", "token", "withdrawn"]
    HOLD_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    WITHDRAWN_FIELD_NUMBER: _ClassVar[int]
    hold_id: str
    name: str
    token: int
    withdrawn: bool
    def __init__(self, hold_id: _Optional[str] = ..., name: _Optional[str] = ..., token: _Optional[int] = ..., withdrawn: bool = ...) -> None: ...

class LockKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
