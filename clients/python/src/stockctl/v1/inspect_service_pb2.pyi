from google.protobuf import timestamp_pb2 as _timestamp_pb2
from stockctl.v1 import lock_service_pb2 as _lock_service_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EtcdEndpoint(_message.Message):
    __slots__ = ["alarms", "db_size", "db_size_in_use", "endpoint", "error", "quota", "version"]
    ALARMS_FIELD_NUMBER: _ClassVar[int]
    DB_SIZE_FIELD_NUMBER: _ClassVar[int]
    DB_SIZE_IN_USE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    alarms: _containers.RepeatedScalarFieldContainer[str]
    db_size: int
    db_size_in_use: int
    endpoint: str
    error: str
    quota: int
    version: str
    def __init__(self, endpoint: _Optional[str] = ..., db_size: _Optional[int] = ..., db_size_in_use: _Optional[int] = ..., quota: _Optional[int] = ..., alarms: _Optional[_Iterable[str]] = ..., version: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class EtcdMember(_message.Message):
    __slots__ = ["client_urls", "id", "leader", "learner", "name", "peer_urls"]
    CLIENT_URLS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PEER_URLS_FIELD_NUMBER: _ClassVar[int]
    client_urls: _containers.RepeatedScalarFieldContainer[str]
    id: str
    leader: bool
    learner: bool
    name: str
    peer_urls: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., client_urls: _Optional[_Iterable[str]] = ..., peer_urls: _Optional[_Iterable[str]] = ..., learner: bool = ..., leader: bool = ...) -> None: ...

class GetClusterRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class GetClusterResponse(_message.Message):
    __slots__ = ["compact_revision", "endpoints", "members", "prefix", "rebalancer_identity", "rebalancer_lease", "revision", "time"]
    COMPACT_REVISION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    REBALANCER_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    REBALANCER_LEASE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    compact_revision: int
    endpoints: _containers.RepeatedCompositeFieldContainer[EtcdEndpoint]
    members: _containers.RepeatedCompositeFieldContainer[EtcdMember]
    prefix: str
    rebalancer_identity: str
    rebalancer_lease: str
    revision: int
    time: _timestamp_pb2.Timestamp
    def __init__(self, revision: _Optional[int] = ..., compact_revision: _Optional[int] = ..., members: _Optional[_Iterable[_Union[EtcdMember, _Mapping]]] = ..., endpoints: _Optional[_Iterable[_Union[EtcdEndpoint, _Mapping]]] = ..., prefix: _Optional[str] = ..., rebalancer_identity: _Optional[str] = ..., rebalancer_lease: _Optional[str] = ..., time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetOrderCountsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class GetOrderCountsResponse(_message.Message):
    __slots__ = ["since", "skus"]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    SKUS_FIELD_NUMBER: _ClassVar[int]
    since: _timestamp_pb2.Timestamp
    skus: _containers.RepeatedCompositeFieldContainer[SKUOrderCounts]
    def __init__(self, since: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., skus: _Optional[_Iterable[_Union[SKUOrderCounts, _Mapping]]] = ...) -> None: ...

class ListLocksRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListLocksResponse(_message.Message):
    __slots__ = ["locks", "revision"]
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    locks: _containers.RepeatedCompositeFieldContainer[LockListing]
    revision: int
    def __init__(self, revision: _Optional[int] = ..., locks: _Optional[_Iterable[_Union[LockListing, _Mapping]]] = ...) -> None: ...

class ListPlaceHoldersRequest(_message.Message):
    __slots__ = ["sku"]
    SKU_FIELD_NUMBER: _ClassVar[int]
    sku: str
    def __init__(self, sku: _Optional[str] = ...) -> None: ...

class ListPlaceHoldersResponse(_message.Message):
    __slots__ = ["places", "revision", "sku"]
    PLACES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    places: _containers.RepeatedCompositeFieldContainer[PlaceHolder]
    revision: int
    sku: str
    def __init__(self, sku: _Optional[str] = ..., revision: _Optional[int] = ..., places: _Optional[_Iterable[_Union[PlaceHolder, _Mapping]]] = ...) -> None: ...

class LockKeyListing(_message.Message):
    __slots__ = ["identity", "key", "kind", "lease", "revision", "token"]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    identity: str
    key: str
    kind: _lock_service_pb2.LockKind
    lease: str
    revision: int
    token: int
    def __init__(self, kind: _Optional[_Union[_lock_service_pb2.LockKind, str]] = ..., key: _Optional[str] = ..., lease: _Optional[str] = ..., revision: _Optional[int] = ..., identity: _Optional[str] = ..., token: _Optional[int] = ...) -> None: ...

class LockListing(_message.Message):
    __slots__ = ["holders", "limit", "name", "semaphore", "waiters"]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SEMAPHORE_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    holders: _containers.RepeatedCompositeFieldContainer[LockKeyListing]
    limit: int
    name: str
    semaphore: bool
    waiters: _containers.RepeatedCompositeFieldContainer[LockKeyListing]
    def __init__(self, name: _Optional[str] = ..., semaphore: bool = ..., limit: _Optional[int] = ..., holders: _Optional[_Iterable[_Union[LockKeyListing, _Mapping]]] = ..., waiters: _Optional[_Iterable[_Union[LockKeyListing, _Mapping]]] = ...) -> None: ...

class PlaceHolder(_message.Message):
    __slots__ = ["identity", "index", "lease", "place", "rebalancer", "waiting"]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    PLACE_FIELD_NUMBER: _ClassVar[int]
    REBALANCER_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    identity: str
    index: int
    lease: str
    place: str
    rebalancer: bool
    waiting: int
    def __init__(self, place: _Optional[str] = ..., index: _Optional[int] = ..., lease: _Optional[str] = ..., identity: _Optional[str] = ..., rebalancer: bool = ..., waiting: _Optional[int] = ...) -> None: ...

class SKUOrderCounts(_message.Message):
    __slots__ = ["failed", "ok", "refused", "sku"]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    failed: int
    ok: int
    refused: int
    sku: str
    def __init__(self, sku: _Optional[str] = ..., ok: _Optional[int] = ..., refused: _Optional[int] = ..., failed: _Optional[int] = ...) -> None: ...
