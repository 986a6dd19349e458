"""stockctl_client: a Python client of stockctl serve's gRPC API.

    from stockctl_client import Client, SoldOut

    with Client("127.0.0.1:7070", token="...") as client:
        try:
            a = client.allocate("iphone", order="o-1", qty=2, route_key="user-42")
        except SoldOut as e:
            print("sold out:", e.remaining, "left at revision", e.revision)

The generated stubs are the package ``stockctl.v1`` (``stock_service_pb2``,
``lock_service_pb2``, ``errors_pb2`` and their ``_grpc`` modules).
"""

from .client import Client, duration, retryable  # noqa: F401
from .errors import *  # noqa: F401,F403
from .errors import BY_CODE, BY_REASON, StockctlError, from_rpc_error, from_status  # noqa: F401
from .feed import OrderFeedConsumer, kind, parse_merged_cursor  # noqa: F401
from .lock import Lock  # noqa: F401
from .orderstream import OrderStream, from_order_error  # noqa: F401
from .aio import AsyncClient  # noqa: F401

__version__ = "0.1.0"
