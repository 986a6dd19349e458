"""Lock: a hold over LockService.Hold, kept alive in the background."""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator, Optional

import grpc

from stockctl.v1 import errors_pb2
from stockctl.v1 import lock_service_pb2 as lk

from . import errors


class Lock:
    """A lock, a shared hold or a semaphore permit over one Hold stream.

    Use it as a context manager (``with client.lock(name) as held``) or
    call acquire() and release(). While held: ``token`` (the fencing token:
    pass it with every write the lock protects), ``key`` and ``revision``
    (to fence your own etcd transactions), ``lost`` (a threading.Event set
    when the hold is lost), ``lost_error`` (the LockLost), ``check()``.
    """

    def __init__(self, client: Any, acquire: lk.HoldAcquire,
                 on_lost: Optional[Callable[[errors.StockctlError], None]] = None):
        self._client, self._acquire, self._on_lost = client, acquire, on_lost
        self.name = acquire.name
        self.token = 0
        self.key = ""
        self.revision = 0
        self.ttl = 0.0
        self.lost = threading.Event()
        self.lost_error: Optional[errors.StockctlError] = None
        self._outbox: "queue.Queue[Optional[lk.HoldRequest]]" = queue.Queue()
        self._released = threading.Event()
        self._done = threading.Event()
        self._call: Any = None

    # -- the stream -------------------------------------------------------

    def _requests(self) -> Iterator[lk.HoldRequest]:
        yield lk.HoldRequest(acquire=self._acquire)
        while True:
            m = self._outbox.get()
            if m is None:
                return
            yield m

    def acquire(self) -> "Lock":
        """Waits for the lock (as long as the acquire's wait allows: LockBusy after it)."""
        stub = self._client._locks[self._client._target()]
        self._call = stub.Hold(self._requests(), metadata=self._client.metadata)
        try:
            first = next(self._call)
        except grpc.RpcError as rpc_err:
            self._outbox.put(None)
            raise errors.from_rpc_error(rpc_err) from None
        except StopIteration:
            self._outbox.put(None)
            raise errors.Internal("the Hold stream ended without an answer") from None
        if first.WhichOneof("event") != "acquired":
            self._outbox.put(None)
            self._call.cancel()
            raise errors.Internal("the Hold stream answered %s before acquired" % first.WhichOneof("event"))
        a = first.acquired
        self.token, self.key, self.revision = a.token, a.key, a.revision
        self.ttl = a.ttl.ToTimedelta().total_seconds() or 15.0
        threading.Thread(target=self._read, name="stockctl-lock-read-" + self.name, daemon=True).start()
        threading.Thread(target=self._keep_alive, name="stockctl-lock-keepalive-" + self.name, daemon=True).start()
        return self

    def _keep_alive(self) -> None:
        while not self._done.wait(self.ttl / 3):
            self._outbox.put(lk.HoldRequest(keep_alive=lk.HoldKeepAlive()))

    def _read(self) -> None:
        try:
            for resp in self._call:
                kind = resp.WhichOneof("event")
                if kind == "released":
                    self._released.set()
                elif kind == "lost":
                    m = resp.lost
                    self._lose(errors.LockLost(m.message or "lock %r was lost" % self.name, details={
                        errors_pb2.LockLost.DESCRIPTOR.full_name: m.SerializeToString()}))
            if not self._released.is_set():
                self._lose(self._broken("the Hold stream ended before release"))
        except grpc.RpcError as rpc_err:
            err = errors.from_rpc_error(rpc_err)
            if self._released.is_set():
                pass
            elif isinstance(err, errors.LockLost):
                self._lose(err)
            else:
                self._lose(self._broken("the Hold stream broke (%s: %s)" % (err.code.name, err.message)))
        finally:
            self._done.set()
            self._outbox.put(None)

    def _broken(self, why: str) -> errors.StockctlError:
        e = errors.LockLost("lock %r (token %d) was lost: %s; another holder may have it now" % (self.name, self.token, why),
                            code=grpc.StatusCode.UNAVAILABLE)
        e.name, e.token, e.lost_reason = self.name, self.token, "STREAM_BROKEN"
        return e

    def _lose(self, err: errors.StockctlError) -> None:
        if self.lost.is_set():
            return
        if getattr(err, "token", None) in (None, 0):
            err.token = self.token
        if not getattr(err, "name", None):
            err.name = self.name
        self.lost_error = err
        self.lost.set()
        if self._on_lost is not None:
            try:
                self._on_lost(err)
            except Exception:  # noqa: BLE001 - a callback's failure must not hide the loss
                pass

    # -- the caller's side -----------------------------------------------

    def check(self) -> None:
        """Raises LockLost if the hold was lost."""
        if self.lost_error is not None:
            raise self.lost_error

    def release(self, timeout: Optional[float] = None) -> None:
        """Releases the hold and waits for the server's answer. Raises LockLost if it had been lost."""
        if self._call is None:
            return
        if not self._done.is_set():
            self._outbox.put(lk.HoldRequest(release=lk.HoldRelease()))
            if not self._done.wait(self._client.timeout if timeout is None else timeout):
                self._call.cancel()
                self._done.wait()
        self.check()

    def __enter__(self) -> "Lock":
        return self.acquire()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.release()
            return
        try:
            self.release()
        except errors.StockctlError:
            pass  # the block's own exception wins
