"""OrderStream: many Allocate and Reserve orders on one stream, each answered on its own."""

from __future__ import annotations

import concurrent.futures
import itertools
import queue
import random
import threading
import time
from typing import Any, Dict, Iterator, Optional, Tuple

import grpc

from stockctl.v1 import stock_service_pb2 as st

from . import errors, rpc_pb2
from .client import Seconds, duration, retryable

# Connect's spelling of a code ("failed_precondition") to grpc's.
_CODES = {c.name.lower(): c for c in grpc.StatusCode}
_CODES["canceled"] = grpc.StatusCode.CANCELLED


def from_order_error(oe: st.OrderError) -> errors.StockctlError:
    """The exception of one order's error in an OrderStream answer."""
    status = rpc_pb2.Status(message=oe.message)
    status.details.extend(oe.details)
    return errors.from_status(_CODES.get(oe.code, grpc.StatusCode.UNKNOWN), oe.message, status.SerializeToString())


class OrderStream:
    """Orders sent on one OrderStream call: a busy caller's many orders per RPC.

    ``allocate(...)`` and ``reserve(...)`` send an order at once and return a
    ``concurrent.futures.Future`` of its answer (AllocateResponse,
    ReserveResponse) or of its exception (SoldOut, PerUserLimitExceeded...,
    as the unary call would raise). If the stream breaks (a server killed,
    UNAVAILABLE), the orders not yet answered are sent again, with the same
    order IDs, on a new stream to the client's next target: those that had
    been committed answer ``replayed``. close() (or leaving the ``with``
    block) waits for every answer and ends the stream.
    """

    def __init__(self, client: Any):
        self._client = client
        self._ids = itertools.count(1)
        self._mu = threading.Lock()
        self._pending: Dict[int, Tuple[st.OrderStreamRequest, concurrent.futures.Future]] = {}
        self._outbox: Optional["queue.Queue[Optional[st.OrderStreamRequest]]"] = None
        self._closed = False
        self._failures = 0
        self._open()

    # -- the stream -------------------------------------------------------

    def _open(self) -> None:
        """A new stream on the current target, with every unanswered order sent again (under _mu)."""
        outbox: "queue.Queue[Optional[st.OrderStreamRequest]]" = queue.Queue()
        for req, _ in self._pending.values():
            outbox.put(req)

        def requests() -> Iterator[st.OrderStreamRequest]:
            while True:
                m = outbox.get()
                if m is None:
                    return
                yield m

        target = self._client._target()
        call = self._client._stock[target].OrderStream(requests(), metadata=self._client.metadata)
        self._outbox = outbox
        threading.Thread(target=self._read, args=(call, outbox, target), name="stockctl-orderstream", daemon=True).start()

    def _read(self, call: Any, outbox: "queue.Queue[Optional[st.OrderStreamRequest]]", target: int) -> None:
        err: Optional[errors.StockctlError] = None
        try:
            for msg in call:
                # A message carries its own answer (when it has an
                # outcome) and those in `more`, ready at the same moment.
                for resp in [msg, *msg.more]:
                    kind = resp.WhichOneof("outcome")
                    if kind is None:
                        continue
                    with self._mu:
                        entry = self._pending.pop(resp.id, None)
                        self._failures = 0
                    if entry is None:
                        continue
                    if kind == "error":
                        entry[1].set_exception(from_order_error(resp.error))
                    else:
                        entry[1].set_result(getattr(resp, kind))
        except grpc.RpcError as rpc_err:
            err = errors.from_rpc_error(rpc_err)
        outbox.put(None)
        with self._mu:
            if self._outbox is not outbox:
                return  # a newer stream took over
            if not self._pending:
                # Nothing to answer: the next order opens a new stream (on the next target if this one broke).
                self._outbox = None
                if err is not None and retryable(err):
                    self._client._failover(target)
                return
            if err is None:
                err = errors.Unavailable("the order stream ended with orders unanswered")
            self._failures += 1
            if not retryable(err) or self._failures >= self._client.attempts:
                for _, fut in self._pending.values():
                    fut.set_exception(err)
                self._pending.clear()
                return
            self._client._failover(target)
            delay = min(self._client.max_backoff, self._client.backoff * 2 ** self._failures) * random.uniform(0.5, 1)
        time.sleep(max(delay, err.retry_delay or 0))
        with self._mu:
            if self._outbox is outbox and self._pending:
                self._open()

    def _send(self, req: st.OrderStreamRequest) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._mu:
            if self._closed:
                raise ValueError("the order stream is closed")
            req.id = next(self._ids)
            self._pending[req.id] = (req, fut)
            if self._outbox is None:
                self._open()  # sends every pending order, this one included
            else:
                self._outbox.put(req)
        return fut

    # -- the caller's side -----------------------------------------------

    def allocate(self, sku: str, order: str, qty: int, route_key: str = "", buyer: str = "") -> concurrent.futures.Future:
        """Sends an Allocate; the future's result is its AllocateResponse (or its exception)."""
        return self._send(st.OrderStreamRequest(allocate=st.AllocateRequest(
            sku=sku, order=order, qty=qty, route_key=route_key, buyer=buyer)))

    def reserve(self, sku: str, order: str, qty: int, ttl: Seconds, route_key: str = "",
                buyer: str = "") -> concurrent.futures.Future:
        """Sends a Reserve; the future's result is its ReserveResponse (or its exception)."""
        return self._send(st.OrderStreamRequest(reserve=st.ReserveRequest(
            sku=sku, order=order, qty=qty, ttl=duration(ttl), route_key=route_key, buyer=buyer)))

    def close(self, timeout: Optional[float] = None) -> None:
        """Waits for every order's answer, then ends the stream."""
        with self._mu:
            self._closed = True
            futs = [f for _, f in self._pending.values()]
        concurrent.futures.wait(futs, timeout=timeout)
        with self._mu:
            if self._outbox is not None:
                self._outbox.put(None)

    def __enter__(self) -> "OrderStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
