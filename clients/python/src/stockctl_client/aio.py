"""AsyncClient: the Client's unary calls and streams for asyncio (grpc.aio).

Every method of Client but lock() is a coroutine here, with the same typed
errors, retries and failover; watch_orders, watch_status, list_skus and
list_sku_clusters are async iterators. Locks and the feed consumer are the threaded Client's::

    async with AsyncClient("127.0.0.1:7070", token) as client:
        a = await client.allocate("iphone", "o-1", 2)
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable, List, Optional, Sequence, Tuple

import grpc
import grpc.aio

from stockctl.v1 import stock_service_pb2 as st

from . import errors
from .client import Client, Seconds, duration, retryable


class AsyncClient(Client):
    @staticmethod
    def _channel(target: str, credentials: Optional[grpc.ChannelCredentials], opts: List[Tuple[str, Any]],
                 interceptors: Sequence[Any]) -> Any:
        if credentials:
            return grpc.aio.secure_channel(target, credentials, options=opts, interceptors=list(interceptors) or None)
        return grpc.aio.insecure_channel(target, options=opts, interceptors=list(interceptors) or None)

    async def _unary(self, service: str, method: str, request: Any, retry: bool = True, target: Optional[int] = None,
                     timeout: Optional[float] = None, post: Optional[Callable[[Any], Any]] = None) -> Any:
        attempts = self.attempts if retry else 1
        for attempt in range(attempts):
            i = self._target() if target is None else target
            stub = (self._stock if service == "stock" else self._locks)[i]
            try:
                resp = await getattr(stub, method)(request, metadata=self.metadata,
                                                   timeout=self.timeout if timeout is None else timeout)
                return post(resp) if post else resp
            except grpc.RpcError as rpc_err:
                err = errors.from_rpc_error(rpc_err)
                if attempt + 1 >= attempts or not retryable(err):
                    raise err from None
                if target is None:
                    self._failover(i)
                await asyncio.sleep(self._delay(attempt, err))
        raise AssertionError("unreachable")

    async def close(self) -> None:  # type: ignore[override]
        for ch in self._channels:
            await ch.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _astream(self, method: str, request: Any, timeout: Optional[float]) -> AsyncIterator[Any]:
        call = getattr(self._stock[self._target()], method)(request, metadata=self.metadata, timeout=timeout)
        try:
            async for resp in call:
                yield resp
        except grpc.RpcError as rpc_err:
            if rpc_err.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
                return  # the caller's timeout, or its cancel: no more now
            raise errors.from_rpc_error(rpc_err) from None
        finally:
            call.cancel()

    def watch_orders(self, sku: str = "", since: int = 0, snapshot: bool = False,  # type: ignore[override]
                     timeout: Optional[float] = None, merged_since: str = "") -> AsyncIterator[st.WatchOrdersResponse]:
        return self._astream("WatchOrders", st.WatchOrdersRequest(sku=sku, since=since, snapshot=snapshot,
                                                                  merged_since=merged_since), timeout)

    async def watch_status(self, sku: str, min_interval: Optional[Seconds] = None,  # type: ignore[override]
                           timeout: Optional[float] = None) -> AsyncIterator[st.StockStatus]:
        async for resp in self._astream("WatchStatus", st.WatchStatusRequest(sku=sku, min_interval=duration(min_interval)),
                                        timeout):
            yield resp.status

    async def list_skus(self, page_size: int = 0) -> AsyncIterator[str]:  # type: ignore[override]
        """Every SKU whose creation has completed, in name order (read a page at a time)."""
        async for sku, _ in self.list_sku_clusters(page_size):
            yield sku

    async def list_sku_clusters(self, page_size: int = 0) -> AsyncIterator[Tuple[str, str]]:  # type: ignore[override]
        """Every SKU with the etcd cluster that holds it ("" on a server of one cluster), in name order."""
        token = ""
        while True:
            page = await self._unary("stock", "ListSKUs", st.ListSKUsRequest(page_size=page_size, page_token=token))
            for sku, cluster in zip(page.skus, list(page.clusters) or [""] * len(page.skus)):
                yield sku, cluster
            token = page.next_page_token
            if not token:
                return

    def lock(self, *args: Any, **kw: Any) -> Any:  # type: ignore[override]
        raise NotImplementedError("locks are the threaded Client's: client.lock(...)")
