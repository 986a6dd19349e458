from google.protobuf import any_pb2 as _any_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from stockctl.v1 import errors_pb2 as _errors_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
ORDER_EVENT_KIND_ALLOCATED: OrderEventKind
ORDER_EVENT_KIND_CANCELLED: OrderEventKind
ORDER_EVENT_KIND_CONFIRMED: OrderEventKind
ORDER_EVENT_KIND_EXPIRED: OrderEventKind
ORDER_EVENT_KIND_RELEASED: OrderEventKind
ORDER_EVENT_KIND_RESERVED: OrderEventKind
ORDER_EVENT_KIND_UNSPECIFIED: OrderEventKind
ORDER_STATE_ALLOCATED: OrderState
ORDER_STATE_CONFIRMED: OrderState
ORDER_STATE_EXPIRED: OrderState
ORDER_STATE_RESERVED: OrderState
ORDER_STATE_UNSPECIFIED: OrderState

class AllocateOrderRequest(_message.Message):
    __slots__ = ["buyer", "lines", "order"]
    BUYER_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    buyer: str
    lines: _containers.RepeatedCompositeFieldContainer[OrderLine]
    order: str
    def __init__(self, order: _Optional[str] = ..., lines: _Optional[_Iterable[_Union[OrderLine, _Mapping]]] = ..., buyer: _Optional[str] = ...) -> None: ...

class AllocateOrderResponse(_message.Message):
    __slots__ = ["buyer", "lines", "order", "released", "replayed", "revision"]
    BUYER_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    buyer: str
    lines: _containers.RepeatedCompositeFieldContainer[AllocateResponse]
    order: str
    released: bool
    replayed: bool
    revision: int
    def __init__(self, order: _Optional[str] = ..., lines: _Optional[_Iterable[_Union[AllocateResponse, _Mapping]]] = ..., revision: _Optional[int] = ..., replayed: bool = ..., released: bool = ..., buyer: _Optional[str] = ...) -> None: ...

class AllocateRequest(_message.Message):
    __slots__ = ["buyer", "order", "qty", "route_key", "sku"]
    BUYER_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    QTY_FIELD_NUMBER: _ClassVar[int]
    ROUTE_KEY_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    buyer: str
    order: str
    qty: int
    route_key: str
    sku: str
    def __init__(self, sku: _Optional[str] = ..., order: _Optional[str] = ..., qty: _Optional[int] = ..., route_key: _Optional[str] = ..., buyer: _Optional[str] = ...) -> None: ...

class AllocateResponse(_message.Message):
    __slots__ = ["buyer", "order", "parts", "qty", "released", "replayed", "revision", "sku"]
    BUYER_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    QTY_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    buyer: str
    order: str
    parts: _containers.RepeatedCompositeFieldContainer[Part]
    qty: int
    released: bool
    replayed: bool
    revision: int
    sku: str
    def __init__(self, sku: _Optional[str] = ..., order: _Optional[str] = ..., qty: _Optional[int] = ..., parts: _Optional[_Iterable[_Union[Part, _Mapping]]] = ..., revision: _Optional[int] = ..., replayed: bool = ..., released: bool = ..., buyer: _Optional[str] = ...) -> None: ...

class AuditRequest(_message.Message):
    __slots__ = ["sku"]
    SKU_FIELD_NUMBER: _ClassVar[int]
    sku: str
    def __init__(self, sku: _Optional[str] = ...) -> None: ...

class AuditResponse(_message.Message):
    __slots__ = ["allocated", "archived", "archived_orders", "buyers", "confirmed", "delivered", "deliveries", "expired_orders", "ok", "orders", "pool", "problems", "pruned_claims", "released_orders", "reserved", "revision", "segments", "sku", "total"]
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_ORDERS_FIELD_NUMBER: _ClassVar[int]
    BUYERS_FIELD_NUMBER: _ClassVar[int]
    CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_ORDERS_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ORDERS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    PRUNED_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_ORDERS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    allocated: int
    archived: int
    archived_orders: int
    buyers: int
    confirmed: int
    delivered: int
    deliveries: int
    expired_orders: int
    ok: bool
    orders: int
    pool: int
    problems: _containers.RepeatedScalarFieldContainer[str]
    pruned_claims: int
    released_orders: int
    reserved: int
    revision: int
    segments: int
    sku: str
    total: int
    def __init__(self, sku: _Optional[str] = ..., ok: bool = ..., revision: _Optional[int] = ..., total: _Optional[int] = ..., pool: _Optional[int] = ..., segments: _Optional[int] = ..., allocated: _Optional[int] = ..., reserved: _Optional[int] = ..., confirmed: _Optional[int] = ..., orders: _Optional[int] = ..., released_orders: _Optional[int] = ..., expired_orders: _Optional[int] = ..., buyers: _Optional[int] = ..., problems: _Optional[_Iterable[str]] = ..., deliveries: _Optional[int] = ..., delivered: _Optional[int] = ..., archived: _Optional[int] = ..., archived_orders: _Optional[int] = ..., pruned_claims: _Optional[int] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ["order", "sku"]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    order: str
    sku: str
    def __init__(self, sku: _Optional[str] = ..., order: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ["buyer", "order", "parts", "qty", "replayed", "revision", "sku", "state"]
    BUYER_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    QTY_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    buyer: str
    order: str
    parts: _containers.RepeatedCompositeFieldContainer[Part]
    qty: int
    replayed: bool
    revision: int
    sku: str
    state: OrderState
    def __init__(self, sku: _Optional[str] = ..., order: _Optional[str] = ..., qty: _Optional[int] = ..., parts: _Optional[_Iterable[_Union[Part, _Mapping]]] = ..., revision: _Optional[int] = ..., replayed: bool = ..., buyer: _Optional[str] = ..., state: _Optional[_Union[OrderState, str]] = ...) -> None: ...

class ConfirmRequest(_message.Message):
    __slots__ = ["order", "sku"]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    order: str
    sku: str
    def __init__(self, sku: _Optional[str] = ..., order: _Optional[str] = ...) -> None: ...

class ConfirmResponse(_message.Message):
    __slots__ = ["buyer", "deadline", "order", "parts", "qty", "replayed", "revision", "sku"]
    BUYER_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    QTY_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    buyer: str
    deadline: _timestamp_pb2.Timestamp
    order: str
    parts: _containers.RepeatedCompositeFieldContainer[Part]
    qty: int
    replayed: bool
    revision: int
    sku: str
    def __init__(self, sku: _Optional[str] = ..., order: _Optional[str] = ..., qty: _Optional[int] = ..., parts: _Optional[_Iterable[_Union[Part, _Mapping]]] = ..., revision: _Optional[int] = ..., replayed: bool = ..., buyer: _Optional[str] = ..., deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateSKURequest(_message.Message):
    __slots__ = ["initial_fill", "low_watermark", "per_user_limit", "refill_batch", "segments", "sku", "total"]
    INITIAL_FILL_FIELD_NUMBER: _ClassVar[int]
    LOW_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    PER_USER_LIMIT_FIELD_NUMBER: _ClassVar[int]
    REFILL_BATCH_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    initial_fill: int
    low_watermark: int
    per_user_limit: int
    refill_batch: int
    segments: int
    sku: str
    total: int
    def __init__(self, sku: _Optional[str] = ..., total: _Optional[int] = ..., segments: _Optional[int] = ..., initial_fill: _Optional[int] = ..., low_watermark: _Optional[int] = ..., refill_batch: _Optional[int] = ..., per_user_limit: _Optional[int] = ...) -> None: ...

class CreateSKUResponse(_message.Message):
    __slots__ = ["create_time", "initial_fill", "low_watermark", "per_user_limit", "pool", "refill_batch", "segments", "sku", "total"]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    INITIAL_FILL_FIELD_NUMBER: _ClassVar[int]
    LOW_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    PER_USER_LIMIT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    REFILL_BATCH_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    create_time: _timestamp_pb2.Timestamp
    initial_fill: int
    low_watermark: int
    per_user_limit: int
    pool: int
    refill_batch: int
    segments: int
    sku: str
    total: int
    def __init__(self, sku: _Optional[str] = ..., total: _Optional[int] = ..., segments: _Optional[int] = ..., initial_fill: _Optional[int] = ..., pool: _Optional[int] = ..., low_watermark: _Optional[int] = ..., refill_batch: _Optional[int] = ..., per_user_limit: _Optional[int] = ..., create_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListSKUsRequest(_message.Message):
    __slots__ = ["page_size", "page_token"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSKUsResponse(_message.Message):
    __slots__ = ["clusters", "next_page_token", "skus"]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SKUS_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedScalarFieldContainer[str]
    next_page_token: str
    skus: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, skus: _Optional[_Iterable[str]] = ..., next_page_token: _Optional[str] = ..., clusters: _Optional[_Iterable[str]] = ...) -> None: ...

class NextExpiryRequest(_message.Message):
    __slots__ = ["sku"]
    SKU_FIELD_NUMBER: _ClassVar[int]
    sku: str
    def __init__(self, sku: _Optional[str] = ...) -> None: ...

class NextExpiryResponse(_message.Message):
    __slots__ = ["deadline", "live"]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    deadline: _timestamp_pb2.Timestamp
    live: bool
    def __init__(self, live: bool = ..., deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class OrderError(_message.Message):
    __slots__ = ["code", "details", "message", "reason"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    code: str
    details: _containers.RepeatedCompositeFieldContainer[_any_pb2.Any]
    message: str
    reason: _errors_pb2.ErrorReason
    def __init__(self, code: _Optional[str] = ..., reason: _Optional[_Union[_errors_pb2.ErrorReason, str]] = ..., message: _Optional[str] = ..., details: _Optional[_Iterable[_Union[_any_pb2.Any, _Mapping]]] = ...) -> None: ...

class OrderEvent(_message.Message):
    __slots__ = ["buyer", "create_time", "deadline", "event", "lines", "order", "parts", "qty", "reservation", "revision", "sku", "version"]
    BUYER_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    QTY_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    buyer: str
    create_time: _timestamp_pb2.Timestamp
    deadline: _timestamp_pb2.Timestamp
    event: OrderEventKind
    lines: _containers.RepeatedScalarFieldContainer[str]
    order: str
    parts: _containers.RepeatedCompositeFieldContainer[Part]
    qty: int
    reservation: bool
    revision: int
    sku: str
    version: int
    def __init__(self, revision: _Optional[int] = ..., event: _Optional[_Union[OrderEventKind, str]] = ..., sku: _Optional[str] = ..., order: _Optional[str] = ..., qty: _Optional[int] = ..., parts: _Optional[_Iterable[_Union[Part, _Mapping]]] = ..., buyer: _Optional[str] = ..., reservation: bool = ..., deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., create_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., version: _Optional[int] = ..., lines: _Optional[_Iterable[str]] = ...) -> None: ...

class OrderLine(_message.Message):
    __slots__ = ["qty", "sku"]
    QTY_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    qty: int
    sku: str
    def __init__(self, sku: _Optional[str] = ..., qty: _Optional[int] = ...) -> None: ...

class OrderStreamRequest(_message.Message):
    __slots__ = ["allocate", "allocate_order", "id", "more", "reserve", "reserve_order"]
    ALLOCATE_FIELD_NUMBER: _ClassVar[int]
    ALLOCATE_ORDER_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    RESERVE_FIELD_NUMBER: _ClassVar[int]
    RESERVE_ORDER_FIELD_NUMBER: _ClassVar[int]
    allocate: AllocateRequest
    allocate_order: AllocateOrderRequest
    id: int
    more: _containers.RepeatedCompositeFieldContainer[OrderStreamRequest]
    reserve: ReserveRequest
    reserve_order: ReserveOrderRequest
    def __init__(self, id: _Optional[int] = ..., allocate: _Optional[_Union[AllocateRequest, _Mapping]] = ..., reserve: _Optional[_Union[ReserveRequest, _Mapping]] = ..., allocate_order: _Optional[_Union[AllocateOrderRequest, _Mapping]] = ..., reserve_order: _Optional[_Union[ReserveOrderRequest, _Mapping]] = ..., more: _Optional[_Iterable[_Union[OrderStreamRequest, _Mapping]]] = ...) -> None: ...

class OrderStreamResponse(_message.Message):
    __slots__ = ["allocated", "allocated_order", "error", "id", "more", "reserved", "reserved_order"]
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_ORDER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    RESERVED_ORDER_FIELD_NUMBER: _ClassVar[int]
    allocated: AllocateResponse
    allocated_order: AllocateOrderResponse
    error: OrderError
    id: int
    more: _containers.RepeatedCompositeFieldContainer[OrderStreamResponse]
    reserved: ReserveResponse
    reserved_order: ReserveOrderResponse
    def __init__(self, id: _Optional[int] = ..., allocated: _Optional[_Union[AllocateResponse, _Mapping]] = ..., reserved: _Optional[_Union[ReserveResponse, _Mapping]] = ..., error: _Optional[_Union[OrderError, _Mapping]] = ..., allocated_order: _Optional[_Union[AllocateOrderResponse, _Mapping]] = ..., reserved_order: _Optional[_Union[ReserveOrderResponse, _Mapping]] = ..., more: _Optional[_Iterable[_Union[OrderStreamResponse, _Mapping]]] = ...) -> None: ...

class Part(_message.Message):
    __slots__ = ["place", "qty"]
    PLACE_FIELD_NUMBER: _ClassVar[int]
    QTY_FIELD_NUMBER: _ClassVar[int]
    place: str
    qty: int
    def __init__(self, place: _Optional[str] = ..., qty: _Optional[int] = ...) -> None: ...

class PrepareRequest(_message.Message):
    __slots__ = ["skus"]
    SKUS_FIELD_NUMBER: _ClassVar[int]
    skus: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, skus: _Optional[_Iterable[str]] = ...) -> None: ...

class PrepareResponse(_message.Message):
    __slots__ = ["owned", "ready", "skipped", "skus"]
    OWNED_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    SKUS_FIELD_NUMBER: _ClassVar[int]
    owned: int
    ready: int
    skipped: int
    skus: int
    def __init__(self, skus: _Optional[int] = ..., ready: _Optional[int] = ..., owned: _Optional[int] = ..., skipped: _Optional[int] = ...) -> None: ...

class RebalancerPass(_message.Message):
    __slots__ = ["leader", "moved", "moves", "revision", "time", "total_moved", "total_moves"]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MOVED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MOVES_FIELD_NUMBER: _ClassVar[int]
    leader: str
    moved: int
    moves: int
    revision: int
    time: _timestamp_pb2.Timestamp
    total_moved: int
    total_moves: int
    def __init__(self, leader: _Optional[str] = ..., time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., moves: _Optional[int] = ..., moved: _Optional[int] = ..., revision: _Optional[int] = ..., total_moves: _Optional[int] = ..., total_moved: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ["order", "sku"]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    order: str
    sku: str
    def __init__(self, sku: _Optional[str] = ..., order: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ["buyer", "order", "parts", "qty", "replayed", "revision", "sku", "state"]
    BUYER_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    QTY_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    buyer: str
    order: str
    parts: _containers.RepeatedCompositeFieldContainer[Part]
    qty: int
    replayed: bool
    revision: int
    sku: str
    state: OrderState
    def __init__(self, sku: _Optional[str] = ..., order: _Optional[str] = ..., qty: _Optional[int] = ..., parts: _Optional[_Iterable[_Union[Part, _Mapping]]] = ..., revision: _Optional[int] = ..., replayed: bool = ..., buyer: _Optional[str] = ..., state: _Optional[_Union[OrderState, str]] = ...) -> None: ...

class ReserveOrderRequest(_message.Message):
    __slots__ = ["buyer", "lines", "order", "ttl"]
    BUYER_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    buyer: str
    lines: _containers.RepeatedCompositeFieldContainer[OrderLine]
    order: str
    ttl: _duration_pb2.Duration
    def __init__(self, order: _Optional[str] = ..., lines: _Optional[_Iterable[_Union[OrderLine, _Mapping]]] = ..., buyer: _Optional[str] = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ReserveOrderResponse(_message.Message):
    __slots__ = ["buyer", "deadline", "lines", "order", "released", "replayed", "revision", "state"]
    BUYER_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    buyer: str
    deadline: _timestamp_pb2.Timestamp
    lines: _containers.RepeatedCompositeFieldContainer[ReserveResponse]
    order: str
    released: bool
    replayed: bool
    revision: int
    state: OrderState
    def __init__(self, order: _Optional[str] = ..., lines: _Optional[_Iterable[_Union[ReserveResponse, _Mapping]]] = ..., revision: _Optional[int] = ..., replayed: bool = ..., released: bool = ..., buyer: _Optional[str] = ..., state: _Optional[_Union[OrderState, str]] = ..., deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ["buyer", "order", "qty", "route_key", "sku", "ttl"]
    BUYER_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    QTY_FIELD_NUMBER: _ClassVar[int]
    ROUTE_KEY_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    buyer: str
    order: str
    qty: int
    route_key: str
    sku: str
    ttl: _duration_pb2.Duration
    def __init__(self, sku: _Optional[str] = ..., order: _Optional[str] = ..., qty: _Optional[int] = ..., route_key: _Optional[str] = ..., buyer: _Optional[str] = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ReserveResponse(_message.Message):
    __slots__ = ["buyer", "deadline", "order", "parts", "qty", "released", "replayed", "revision", "sku", "state"]
    BUYER_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    QTY_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    buyer: str
    deadline: _timestamp_pb2.Timestamp
    order: str
    parts: _containers.RepeatedCompositeFieldContainer[Part]
    qty: int
    released: bool
    replayed: bool
    revision: int
    sku: str
    state: OrderState
    def __init__(self, sku: _Optional[str] = ..., order: _Optional[str] = ..., qty: _Optional[int] = ..., parts: _Optional[_Iterable[_Union[Part, _Mapping]]] = ..., revision: _Optional[int] = ..., replayed: bool = ..., released: bool = ..., buyer: _Optional[str] = ..., state: _Optional[_Union[OrderState, str]] = ..., deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RestockRequest(_message.Message):
    __slots__ = ["delivery", "qty", "sku"]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    QTY_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    delivery: str
    qty: int
    sku: str
    def __init__(self, sku: _Optional[str] = ..., qty: _Optional[int] = ..., delivery: _Optional[str] = ...) -> None: ...

class RestockResponse(_message.Message):
    __slots__ = ["delivery", "pool", "qty", "replayed", "revision", "sku", "total"]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    QTY_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    delivery: str
    pool: int
    qty: int
    replayed: bool
    revision: int
    sku: str
    total: int
    def __init__(self, sku: _Optional[str] = ..., qty: _Optional[int] = ..., total: _Optional[int] = ..., pool: _Optional[int] = ..., revision: _Optional[int] = ..., replayed: bool = ..., delivery: _Optional[str] = ...) -> None: ...

class SegmentStatus(_message.Message):
    __slots__ = ["inbox", "index", "remaining"]
    INBOX_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    inbox: int
    index: int
    remaining: int
    def __init__(self, index: _Optional[int] = ..., remaining: _Optional[int] = ..., inbox: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ["sku"]
    SKU_FIELD_NUMBER: _ClassVar[int]
    sku: str
    def __init__(self, sku: _Optional[str] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ["status"]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: StockStatus
    def __init__(self, status: _Optional[_Union[StockStatus, _Mapping]] = ...) -> None: ...

class StockStatus(_message.Message):
    __slots__ = ["allocated", "archived", "archived_orders", "create_time", "low_watermark", "orders", "per_user_limit", "pool", "pruned_claims", "rebalancer", "rebalancer_leader", "refill_batch", "remaining", "reservations", "reserved", "revision", "segments", "sku", "total"]
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_ORDERS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    LOW_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    ORDERS_FIELD_NUMBER: _ClassVar[int]
    PER_USER_LIMIT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    PRUNED_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    REBALANCER_FIELD_NUMBER: _ClassVar[int]
    REBALANCER_LEADER_FIELD_NUMBER: _ClassVar[int]
    REFILL_BATCH_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    allocated: int
    archived: int
    archived_orders: int
    create_time: _timestamp_pb2.Timestamp
    low_watermark: int
    orders: int
    per_user_limit: int
    pool: int
    pruned_claims: int
    rebalancer: RebalancerPass
    rebalancer_leader: str
    refill_batch: int
    remaining: int
    reservations: int
    reserved: int
    revision: int
    segments: _containers.RepeatedCompositeFieldContainer[SegmentStatus]
    sku: str
    total: int
    def __init__(self, sku: _Optional[str] = ..., total: _Optional[int] = ..., pool: _Optional[int] = ..., remaining: _Optional[int] = ..., allocated: _Optional[int] = ..., reserved: _Optional[int] = ..., reservations: _Optional[int] = ..., orders: _Optional[int] = ..., revision: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[SegmentStatus, _Mapping]]] = ..., low_watermark: _Optional[int] = ..., refill_batch: _Optional[int] = ..., per_user_limit: _Optional[int] = ..., create_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., rebalancer: _Optional[_Union[RebalancerPass, _Mapping]] = ..., rebalancer_leader: _Optional[str] = ..., archived: _Optional[int] = ..., archived_orders: _Optional[int] = ..., pruned_claims: _Optional[int] = ...) -> None: ...

class WatchOrdersRequest(_message.Message):
    __slots__ = ["merged_since", "since", "sku", "snapshot"]
    MERGED_SINCE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    merged_since: str
    since: int
    sku: str
    snapshot: bool
    def __init__(self, sku: _Optional[str] = ..., since: _Optional[int] = ..., snapshot: bool = ..., merged_since: _Optional[str] = ...) -> None: ...

class WatchOrdersResponse(_message.Message):
    __slots__ = ["cursor", "events", "merged_cursor", "snapshot"]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    MERGED_CURSOR_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    cursor: int
    events: _containers.RepeatedCompositeFieldContainer[OrderEvent]
    merged_cursor: str
    snapshot: bool
    def __init__(self, events: _Optional[_Iterable[_Union[OrderEvent, _Mapping]]] = ..., cursor: _Optional[int] = ..., snapshot: bool = ..., merged_cursor: _Optional[str] = ...) -> None: ...

class WatchStatusRequest(_message.Message):
    __slots__ = ["min_interval", "sku"]
    MIN_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    SKU_FIELD_NUMBER: _ClassVar[int]
    min_interval: _duration_pb2.Duration
    sku: str
    def __init__(self, sku: _Optional[str] = ..., min_interval: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WatchStatusResponse(_message.Message):
    __slots__ = ["status"]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: StockStatus
    def __init__(self, status: _Optional[_Union[StockStatus, _Mapping]] = ...) -> None: ...

class OrderState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class OrderEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
