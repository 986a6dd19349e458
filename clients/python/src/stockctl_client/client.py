"""Client: stockctl's API over gRPC, with typed errors, retries and failover."""

from __future__ import annotations

import datetime
import random
import threading
import time
import uuid
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import grpc
from google.protobuf import duration_pb2

from stockctl.v1 import lock_service_pb2 as lk
from stockctl.v1 import lock_service_pb2_grpc as lkg
from stockctl.v1 import stock_service_pb2 as st
from stockctl.v1 import stock_service_pb2_grpc as stg

from . import errors

Seconds = Union[float, int, datetime.timedelta]

#: gRPC codes retried with the same request (orders are idempotent by order ID).
RETRY_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED})
#: Reasons retried besides those codes: the server asks for it with a RetryInfo.
RETRY_REASONS = frozenset({"OVERLOADED", "CONTENTION"})

LOCK_KINDS = {"exclusive": lk.LOCK_KIND_EXCLUSIVE, "shared": lk.LOCK_KIND_SHARED, "semaphore": lk.LOCK_KIND_SEMAPHORE}


def duration(value: Optional[Seconds]) -> Optional[duration_pb2.Duration]:
    """A google.protobuf.Duration of seconds (a number) or a timedelta; None stays None."""
    if value is None:
        return None
    d = duration_pb2.Duration()
    if isinstance(value, datetime.timedelta):
        d.FromTimedelta(value)
    else:
        d.FromNanoseconds(int(round(value * 1e9)))
    return d


def _seconds(value: Optional[Seconds]) -> Optional[float]:
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return value


class Client:
    """A client of one or more ``stockctl serve`` processes sharing an etcd.

    ``targets`` is ``"host:port"`` or a list of them. Calls go to the first;
    a call that fails with UNAVAILABLE, CANCELLED or DEADLINE_EXCEEDED (or is
    refused with OVERLOADED or CONTENTION) is retried with the **same
    request**, on the next target, up to ``attempts`` times with exponential
    backoff: orders, reservations, confirms, cancels, releases and restocks
    are idempotent by their IDs, so a retry whose first attempt landed
    answers ``replayed=True`` and deducts nothing. ``timeout`` bounds each
    attempt (seconds). ``token`` is the bearer token; ``credentials`` a
    ``grpc.ssl_channel_credentials(...)`` for TLS (None: plaintext, loopback
    only). ``interceptors`` are gRPC client interceptors for every channel.

    Answers are the API's protobuf messages (``stockctl.v1``); errors are
    the exceptions of :mod:`stockctl_client.errors`.
    """

    def __init__(self, targets: Union[str, Sequence[str]], token: Optional[str] = None, *,
                 credentials: Optional[grpc.ChannelCredentials] = None, timeout: float = 10.0,
                 attempts: int = 5, backoff: float = 0.05, max_backoff: float = 2.0,
                 options: Sequence[Tuple[str, Any]] = (), interceptors: Sequence[Any] = ()):
        self.targets: List[str] = [targets] if isinstance(targets, str) else list(targets)
        if not self.targets:
            raise ValueError("no target")
        self.timeout, self.attempts, self.backoff, self.max_backoff = timeout, max(1, attempts), backoff, max_backoff
        self.metadata: Tuple[Tuple[str, str], ...] = (("authorization", "Bearer " + token),) if token else ()
        # Keepalive pings find a dead server under a quiet stream (a held lock, an idle feed).
        opts = [("grpc.keepalive_time_ms", 10000), ("grpc.keepalive_timeout_ms", 5000),
                ("grpc.keepalive_permit_without_calls", 0), ("grpc.http2.max_pings_without_data", 0)] + list(options)
        self._channels = [self._channel(t, credentials, opts, interceptors) for t in self.targets]
        self._stock = [stg.StockServiceStub(ch) for ch in self._channels]
        self._locks = [lkg.LockServiceStub(ch) for ch in self._channels]
        self._mu = threading.Lock()
        self._current = 0

    # -- plumbing ---------------------------------------------------------

    @staticmethod
    def _channel(target: str, credentials: Optional[grpc.ChannelCredentials], opts: List[Tuple[str, Any]],
                 interceptors: Sequence[Any]) -> Any:
        ch = grpc.secure_channel(target, credentials, options=opts) if credentials else grpc.insecure_channel(target, options=opts)
        if interceptors:
            ch = grpc.intercept_channel(ch, *interceptors)
        return ch

    def close(self) -> None:
        for ch in self._channels:
            ch.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _target(self) -> int:
        with self._mu:
            return self._current

    def _failover(self, failed: int) -> None:
        with self._mu:
            if self._current == failed:
                self._current = (failed + 1) % len(self.targets)

    def _delay(self, attempt: int, err: errors.StockctlError) -> float:
        d = min(self.max_backoff, self.backoff * (2 ** attempt)) * random.uniform(0.5, 1.0)
        return max(d, err.retry_delay or 0.0)

    def _unary(self, service: str, method: str, request: Any, retry: bool = True, target: Optional[int] = None,
               timeout: Optional[float] = None, post: Optional[Callable[[Any], Any]] = None) -> Any:
        attempts = self.attempts if retry else 1
        for attempt in range(attempts):
            i = self._target() if target is None else target
            stub = (self._stock if service == "stock" else self._locks)[i]
            try:
                resp = getattr(stub, method)(request, metadata=self.metadata,
                                             timeout=self.timeout if timeout is None else timeout)
                return post(resp) if post else resp
            except grpc.RpcError as rpc_err:
                err = errors.from_rpc_error(rpc_err)
                if attempt + 1 >= attempts or not retryable(err):
                    raise err from None
                if target is None:
                    self._failover(i)
                time.sleep(self._delay(attempt, err))
        raise AssertionError("unreachable")

    def _stream(self, method: str, request: Any, timeout: Optional[float]) -> Iterator[Any]:
        call = getattr(self._stock[self._target()], method)(request, metadata=self.metadata, timeout=timeout)
        return _MappedStream(call)

    # -- StockService -----------------------------------------------------

    def create_sku(self, sku: str, total: int, segments: int, initial_fill: int = 0, low_watermark: int = 0,
                   refill_batch: int = 0, per_user_limit: int = 0) -> st.CreateSKUResponse:
        """Creates a SKU. Not retried: a retry whose first attempt landed would answer SKUExists."""
        return self._unary("stock", "CreateSKU", st.CreateSKURequest(
            sku=sku, total=total, segments=segments, initial_fill=initial_fill, low_watermark=low_watermark,
            refill_batch=refill_batch, per_user_limit=per_user_limit), retry=False)

    def allocate(self, sku: str, order: str, qty: int, route_key: str = "", buyer: str = "") -> st.AllocateResponse:
        """Takes qty units for the order, final at once. Raises SoldOut, PerUserLimitExceeded, OrderConflict..."""
        return self._unary("stock", "Allocate", st.AllocateRequest(sku=sku, order=order, qty=qty, route_key=route_key,
                                                                   buyer=buyer))

    def reserve(self, sku: str, order: str, qty: int, ttl: Seconds, route_key: str = "",
                buyer: str = "") -> st.ReserveResponse:
        """Holds qty units until confirm(), for at most ttl (seconds or a timedelta)."""
        return self._unary("stock", "Reserve", st.ReserveRequest(sku=sku, order=order, qty=qty, ttl=duration(ttl),
                                                                 route_key=route_key, buyer=buyer))

    def allocate_order(self, order: str, lines: Iterable[Tuple[str, int]], buyer: str = "") -> st.AllocateOrderResponse:
        """Takes every line ((sku, qty) pairs, each SKU once) for the order, or none, in one transaction.

        Raises SoldOut (or PerUserLimitExceeded) naming the refused line in
        ``details["stockctl.v1.RefusedLine"]`` (a RefusedLine: index, sku,
        qty); OrderConflict for the ID used with other lines. Confirm,
        cancel and release with any line's SKU act on the whole order.
        """
        return self._unary("stock", "AllocateOrder", st.AllocateOrderRequest(
            order=order, lines=[st.OrderLine(sku=s, qty=q) for s, q in lines], buyer=buyer))

    def reserve_order(self, order: str, lines: Iterable[Tuple[str, int]], ttl: Seconds,
                      buyer: str = "") -> st.ReserveOrderResponse:
        """allocate_order as a reservation of every line, until confirm() of any line, for at most ttl."""
        return self._unary("stock", "ReserveOrder", st.ReserveOrderRequest(
            order=order, lines=[st.OrderLine(sku=s, qty=q) for s, q in lines], ttl=duration(ttl), buyer=buyer))

    def confirm(self, sku: str, order: str) -> st.ConfirmResponse:
        """Makes a reservation final. Raises ReservationExpired, OrderStateConflict."""
        return self._unary("stock", "Confirm", st.ConfirmRequest(sku=sku, order=order))

    def cancel(self, sku: str, order: str) -> st.CancelResponse:
        """Gives a live reservation's units back."""
        return self._unary("stock", "Cancel", st.CancelRequest(sku=sku, order=order))

    def release(self, sku: str, order: str) -> st.ReleaseResponse:
        """Gives an order's units back (an allocation, a live or confirmed reservation)."""
        return self._unary("stock", "Release", st.ReleaseRequest(sku=sku, order=order))

    def restock(self, sku: str, qty: int, delivery: str) -> st.RestockResponse:
        """Adds a delivery to the pool, idempotent by the delivery ID."""
        return self._unary("stock", "Restock", st.RestockRequest(sku=sku, qty=qty, delivery=delivery))

    def status(self, sku: str) -> st.StockStatus:
        """The SKU's stock at one etcd revision."""
        return self._unary("stock", "Status", st.StatusRequest(sku=sku), post=lambda r: r.status)

    def audit(self, sku: str) -> st.AuditResponse:
        """Checks the books; ok is False (with problems) when they do not balance."""
        return self._unary("stock", "Audit", st.AuditRequest(sku=sku))

    def watch_status(self, sku: str, min_interval: Optional[Seconds] = None,
                     timeout: Optional[float] = None) -> Iterator[st.StockStatus]:
        """The SKU's stock now, then after changes, until timeout (seconds) or until the iterator is closed."""
        for resp in self._stream("WatchStatus", st.WatchStatusRequest(sku=sku, min_interval=duration(min_interval)),
                                 timeout):
            yield resp.status

    def watch_orders(self, sku: str = "", since: int = 0, snapshot: bool = False,
                     timeout: Optional[float] = None, merged_since: str = "") -> "_MappedStream":
        """The order feed's batches (WatchOrdersResponse: events, cursor, snapshot) after the cursor since.

        It ends at timeout (seconds; the stream simply stops) or raises the stream's error mapped
        (CursorCompacted, CursorAhead, Unavailable...). cancel() ends it. For
        a consumer that stores its cursor with what it applies, and resumes,
        use stockctl_client.OrderFeedConsumer.

        On a server over several etcd clusters, every SKU's feed (no sku) is
        the clusters' feeds merged: each batch is one cluster's, its
        ``merged_cursor`` the position to store (``cursor`` is 0), and
        ``merged_since`` resumes from it (not with since or snapshot). A
        cursor naming a cluster the server does not have (or skipping a
        removed cluster's last events) raises MergedCursorRefused; one
        compacted, CursorCompacted with ``cluster``.
        """
        return self._stream("WatchOrders", st.WatchOrdersRequest(sku=sku, since=since, snapshot=snapshot,
                                                                 merged_since=merged_since), timeout)

    def list_skus(self, page_size: int = 0) -> Iterator[str]:
        """Every SKU whose creation has completed, in name order (read a page at a time)."""
        token = ""
        while True:
            page = self._unary("stock", "ListSKUs", st.ListSKUsRequest(page_size=page_size, page_token=token))
            yield from page.skus
            token = page.next_page_token
            if not token:
                return

    def list_sku_clusters(self, page_size: int = 0) -> Iterator[Tuple[str, str]]:
        """Every SKU with the etcd cluster that holds it, (sku, cluster) in name order; the cluster is ""
        on a server of one cluster."""
        token = ""
        while True:
            page = self._unary("stock", "ListSKUs", st.ListSKUsRequest(page_size=page_size, page_token=token))
            clusters = list(page.clusters) or [""] * len(page.skus)
            yield from zip(page.skus, clusters)
            token = page.next_page_token
            if not token:
                return

    def prepare(self, skus: Sequence[str]) -> st.PrepareResponse:
        """Readies the server this client reaches to sell skus shortly before their sale opens.

        Its first order of each then writes one key, its record (PrepareResponse: skus, ready,
        owned, skipped). It prepares that one serve process: call it on each that will sell.
        An invalid name raises InvalidArgument, an unknown SKU SKUNotFound, and nothing is done.
        """
        return self._unary("stock", "Prepare", st.PrepareRequest(skus=list(skus)))

    def next_expiry(self, sku: str) -> Optional[datetime.datetime]:
        """The earliest deadline among sku's live (unconfirmed) reservations, or None.

        Units those reservations hold may come back to the SKU then (the rebalancer expires a
        reservation normally well within a second of its deadline): a buyer refused with
        SoldOut can be told whether to look again, and when. One read of the reservation index,
        not a Status. The deadline is a naive datetime in UTC, as the errors' are. An invalid
        name raises InvalidArgument, an unknown SKU SKUNotFound.
        """
        # post, not a statement after the call: AsyncClient's _unary is a coroutine.
        return self._unary("stock", "NextExpiry", st.NextExpiryRequest(sku=sku),
                           post=lambda r: r.deadline.ToDatetime() if r.live else None)

    def order_stream(self) -> "OrderStream":
        """Many Allocate and Reserve orders on one stream, each answered on its own (a Future)::

            with client.order_stream() as orders:
                futures = [orders.allocate("iphone", "o-%d" % i, 1) for i in range(1000)]
            for f in futures:
                try:
                    f.result()
                except SoldOut:
                    ...

        Orders not answered when the stream breaks are sent again with the
        same order IDs on a new stream (to the next target): never twice taken.
        """
        from .orderstream import OrderStream
        return OrderStream(self)

    # -- LockService ------------------------------------------------------

    def lock(self, name: str, *, ttl: Seconds = 15, kind: str = "exclusive", limit: int = 0,
             wait: Optional[Seconds] = None, on_lost: Optional[Callable[["errors.StockctlError"], None]] = None) -> "Lock":
        """A lock held over the Hold stream, as a context manager::

            with client.lock("nightly-report", ttl=30) as held:
                write(fencing_token=held.token)
                held.check()                # raises LockLost if it was lost meanwhile

        The hold is kept alive in the background (every ttl/3) until the
        block ends; if it is lost (the server says so, or the stream breaks)
        ``held.lost`` is set, ``on_lost(LockLost)`` is called from the
        background thread, and leaving the block raises LockLost. kind:
        "exclusive", "shared" or "semaphore" (with limit). wait: give up
        after it with LockBusy (None: wait as long as it takes).
        """
        from .lock import Lock
        return Lock(self, lk.HoldAcquire(name=name, kind=LOCK_KINDS[kind] if isinstance(kind, str) else kind,
                                         ttl=duration(ttl), wait=duration(wait), limit=limit), on_lost)

    def acquire(self, name: str, *, ttl: Seconds = 15, kind: str = "exclusive", limit: int = 0,
                wait: Optional[Seconds] = None, request_id: Optional[str] = None) -> lk.AcquireResponse:
        """The unary shape: a hold kept by KeepAlive (keep_alive) at least every ttl, on the same server.

        The request carries a request_id (a random one unless given): an
        attempt whose answer was lost is retried with it, on the same server,
        and answers the hold it was granted (``replayed``). The timeout is
        the client's per attempt, plus ``wait`` when given.
        """
        rid = request_id or "py-" + uuid.uuid4().hex
        return self._unary("lock", "Acquire", lk.AcquireRequest(
            name=name, kind=LOCK_KINDS[kind] if isinstance(kind, str) else kind, ttl=duration(ttl),
            wait=duration(wait), limit=limit, request_id=rid), target=self._target(),
            timeout=None if wait is None else _seconds(wait) + self.timeout)

    def keep_alive(self, hold_id: str) -> lk.KeepAliveResponse:
        return self._unary("lock", "KeepAlive", lk.KeepAliveRequest(hold_id=hold_id), retry=False)

    def release_hold(self, hold_id: str = "", request_id: str = "") -> lk.LockServiceReleaseResponse:
        """Releases a hold by its hold_id, or by its Acquire's request_id (withdrawing it if nothing was granted)."""
        return self._unary("lock", "Release", lk.LockServiceReleaseRequest(hold_id=hold_id, request_id=request_id),
                           retry=False)


def retryable(err: errors.StockctlError) -> bool:
    """Whether the client retries err (with the same request)."""
    return err.code in RETRY_CODES or err.reason in RETRY_REASONS


class _MappedStream:
    """A server stream whose errors are stockctl_client.errors exceptions; cancel() ends it."""

    def __init__(self, call: Any):
        self._call = call
        self._cancelled = False

    def __iter__(self) -> "_MappedStream":
        return self

    def __next__(self) -> Any:
        try:
            return next(self._call)
        except grpc.RpcError as rpc_err:
            # The caller's timeout or cancel(): "no more now", as the server's OK at the deadline.
            if rpc_err.code() == grpc.StatusCode.DEADLINE_EXCEEDED or (
                    self._cancelled and rpc_err.code() == grpc.StatusCode.CANCELLED):
                raise StopIteration from None
            raise errors.from_rpc_error(rpc_err) from None

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()


from .lock import Lock  # noqa: E402  (for the annotation)
from .orderstream import OrderStream  # noqa: E402
