"""OrderFeedConsumer: WatchOrders applied exactly once, the cursor stored in the caller's transaction."""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable, List, Optional, Sequence

from stockctl.v1 import stock_service_pb2 as st

from . import errors
from .client import Client, retryable

#: The event kinds without their prefix, as `stockctl orders` spells them: "allocated", "reserved"...
KINDS = {v: st.OrderEventKind.Name(v)[len("ORDER_EVENT_KIND_"):].lower() for v in st.OrderEventKind.values()}


def kind(event: st.OrderEvent) -> str:
    """The event's kind in lower case ("allocated", "confirmed"...), also the order's state after it."""
    return KINDS.get(event.event, str(event.event))


class OrderFeedConsumer:
    """Applies the order feed to a database exactly once.

    ``conn`` is a DB-API connection (sqlite3, psycopg...). For each batch the
    consumer calls ``apply(cursor, events)`` with a cursor of ``conn``, stores
    the batch's feed cursor in the table ``cursor_table`` (row ``scope``)
    with that same cursor, and commits: the rows and the feed's position
    commit together, so a consumer killed at any point resumes exactly
    after the last batch it committed, with no gap and no duplicate.
    Write ``apply`` as an upsert that keeps the newest revision (see
    docs/feed.md) and it also stays right if two consumers run by mistake.

    A broken stream (a server killed, a deploy) is opened again from the
    stored cursor, on the client's next target. A cursor older than etcd's
    compacted history raises CursorCompacted, or with
    ``on_compacted="snapshot"`` starts again from a snapshot (every order in
    its current state, applied in one transaction with its cursor).
    Before the first batch is stored the feed starts after ``since`` (0: the
    start of etcd's history), or from a snapshot with ``snapshot_first``.
    ``paramstyle`` is the DB-API module's ("qmark" for sqlite3, "format"
    or "pyformat" for psycopg, "numeric").
    """

    def __init__(self, client: Client, conn: Any, apply: Callable[[Any, Sequence[st.OrderEvent]], None], *,
                 sku: str = "", scope: Optional[str] = None, cursor_table: str = "stockctl_feed_cursor",
                 paramstyle: str = "qmark", on_compacted: str = "raise", snapshot_first: bool = False,
                 since: int = 0, stream_timeout: float = 60.0):
        if not cursor_table.replace("_", "").isalnum():
            raise ValueError("cursor_table must be a plain SQL name")
        if on_compacted not in ("raise", "snapshot"):
            raise ValueError('on_compacted must be "raise" or "snapshot"')
        self.client, self.conn, self.apply = client, conn, apply
        self.sku, self.scope = sku, scope if scope is not None else (sku or "*")
        self.table, self.on_compacted, self.snapshot_first = cursor_table, on_compacted, snapshot_first
        self.stream_timeout, self.since = stream_timeout, since
        p = {"qmark": ("?", "?"), "format": ("%s", "%s"), "pyformat": ("%s", "%s"), "numeric": (":1", ":2")}[paramstyle]
        self._select = "SELECT revision FROM %s WHERE scope = %s" % (cursor_table, p[0])
        self._upsert = ("INSERT INTO %s (scope, revision) VALUES (%s, %s) ON CONFLICT (scope) DO UPDATE "
                        "SET revision = excluded.revision" % (cursor_table, p[0], p[1]))
        self._stop = threading.Event()
        self._stream: Any = None
        self.batches = 0
        self.reopened = 0
        c = conn.cursor()
        c.execute("CREATE TABLE IF NOT EXISTS %s (scope TEXT PRIMARY KEY, revision BIGINT NOT NULL)" % cursor_table)
        conn.commit()

    def cursor(self) -> Optional[int]:
        """The stored cursor, or None before the first batch."""
        c = self.conn.cursor()
        c.execute(self._select, (self.scope,))
        row = c.fetchone()
        self.conn.commit()
        return None if row is None else int(row[0])

    def _commit(self, events: List[st.OrderEvent], cursor: int) -> None:
        c = self.conn.cursor()
        try:
            self.apply(c, events)
            c.execute(self._upsert, (self.scope, cursor))
            self.conn.commit()
        except BaseException:
            self.conn.rollback()
            raise
        self.batches += 1

    def stop(self) -> None:
        """Makes run() return after the batch it is applying (from another thread)."""
        self._stop.set()
        s = self._stream
        if s is not None:
            s.cancel()

    def run(self, until: Optional[int] = None) -> int:
        """Applies batches until stop(), or until the stored cursor reaches ``until`` (a revision, e.g. an
        order's); returns the stored cursor."""
        attempt = 0
        snapshot = False
        while not self._stop.is_set():
            cur = self.cursor()
            if until is not None and (self.since if cur is None else cur) >= until:
                return cur
            snapshot = snapshot or (cur is None and self.snapshot_first)
            stream = self.client.watch_orders(self.sku, since=0 if snapshot else (self.since if cur is None else cur), snapshot=snapshot,
                                              timeout=self.stream_timeout)
            self._stream = stream
            pending: List[st.OrderEvent] = []
            try:
                for batch in stream:
                    attempt = 0
                    if batch.snapshot and batch.cursor == 0:
                        pending.extend(batch.events)  # a snapshot page: its cursor comes on the last page
                        continue
                    self._commit(pending + list(batch.events), batch.cursor)
                    pending, snapshot = [], False
                    if until is not None and batch.cursor >= until:
                        stream.cancel()
                        return batch.cursor
                    if self._stop.is_set():
                        stream.cancel()
                        break
            except errors.CursorCompacted:
                if self.on_compacted != "snapshot":
                    raise
                snapshot = True
                continue
            except errors.StockctlError as err:
                if not retryable(err) or self._stop.is_set():
                    if self._stop.is_set():
                        break
                    raise
                self.client._failover(self.client._target())
                time.sleep(min(self.client.max_backoff, self.client.backoff * 2 ** attempt) * random.uniform(0.5, 1))
                attempt += 1
            finally:
                self._stream = None
            self.reopened += 1
        c = self.cursor()
        return 0 if c is None else c
