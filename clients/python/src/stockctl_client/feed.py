"""OrderFeedConsumer: WatchOrders applied exactly once, the cursor stored in the caller's transaction."""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from stockctl.v1 import stock_service_pb2 as st

from . import errors
from .client import Client, retryable

#: The event kinds without their prefix, as `stockctl orders` spells them: "allocated", "reserved"...
KINDS = {v: st.OrderEventKind.Name(v)[len("ORDER_EVENT_KIND_"):].lower() for v in st.OrderEventKind.values()}


def kind(event: st.OrderEvent) -> str:
    """The event's kind in lower case ("allocated", "confirmed"...), also the order's state after it."""
    return KINDS.get(event.event, str(event.event))


#: A feed's position: a revision (a feed of one etcd cluster), or a merged cursor (a string: a feed of
#: every SKU on a server over several clusters).
Position = Union[int, str]


def parse_merged_cursor(cursor: Union[str, Mapping[str, int]]) -> Dict[str, int]:
    """A merged cursor's revision per cluster ("a=1204,b=877" -> {"a": 1204, "b": 877}).

    Store and pass a merged cursor as the string it is; this is for comparing
    positions (``run(until=...)``), and the format is the server's
    (feed.Cursor): a consumer should not build one."""
    if isinstance(cursor, Mapping):
        return {str(k): int(v) for k, v in cursor.items()}
    out: Dict[str, int] = {}
    for part in filter(None, cursor.split(",")):
        name, sep, rev = part.partition("=")
        if not sep or not name:
            raise ValueError("not a merged cursor: %r" % cursor)
        out[name] = int(rev)
    return out


def _reached(pos: Position, until: Union[int, str, Mapping[str, int]]) -> bool:
    """Whether the position pos is at or past until (a revision, or per cluster for a merged feed)."""
    if isinstance(until, int):
        if isinstance(pos, str):
            raise TypeError("until is a revision, but the feed is merged (its cursor %r): pass a merged cursor "
                            "or a {cluster: revision} mapping" % pos)
        return pos >= until
    want = parse_merged_cursor(until)
    have = parse_merged_cursor(pos) if isinstance(pos, str) else {}
    if isinstance(pos, int) and pos != 0:
        raise TypeError("until is a merged cursor, but the feed's cursor is a revision (%d)" % pos)
    return all(have.get(c, 0) >= r for c, r in want.items())


class OrderFeedConsumer:
    """Applies the order feed to a database exactly once.

    ``conn`` is a DB-API connection (sqlite3, psycopg...). For each batch the
    consumer calls ``apply(cursor, events)`` with a cursor of ``conn``, stores
    the batch's feed position in the table ``cursor_table`` (row ``scope``)
    with that same cursor, and commits: the rows and the feed's position
    commit together, so a consumer killed at any point resumes exactly
    after the last batch it committed, with no gap and no duplicate.
    Write ``apply`` as an upsert that keeps the newest revision (see
    docs/feed.md) and it also stays right if two consumers run by mistake.

    The position is a revision (column ``revision``), or, for every SKU's
    feed on a server over several etcd clusters, the merged cursor the
    server sends with each batch (column ``merged_cursor``, a string: a
    revision per cluster; ``revision`` is then 0): the consumer stores
    whichever the server sends and resumes from it (``merged_since``). A
    table made by an older version gains the ``merged_cursor`` column
    (ALTER TABLE ... ADD COLUMN) when the consumer is made.

    A broken stream (a server killed, a deploy) is opened again from the
    stored position, on the client's next target. A cursor older than etcd's
    compacted history raises CursorCompacted (on a merged feed its
    ``cluster`` names the cluster), or with ``on_compacted="snapshot"``
    starts again from a snapshot (every order in its current state, applied
    in one transaction with its cursor; not on a merged feed, which has no
    snapshot: there it raises). A merged cursor naming a cluster the server
    does not have, or skipping a removed cluster's last events, raises
    MergedCursorRefused (``cluster`` names it). Before the first batch is stored the feed starts
    after ``since`` (0: the start of etcd's history, or of every cluster's;
    a merged cursor string: from it), or from a snapshot with
    ``snapshot_first`` (a feed of one cluster only). ``paramstyle`` is the
    DB-API module's ("qmark" for sqlite3, "format" or "pyformat" for
    psycopg, "numeric").
    """

    def __init__(self, client: Client, conn: Any, apply: Callable[[Any, Sequence[st.OrderEvent]], None], *,
                 sku: str = "", scope: Optional[str] = None, cursor_table: str = "stockctl_feed_cursor",
                 paramstyle: str = "qmark", on_compacted: str = "raise", snapshot_first: bool = False,
                 since: Position = 0, stream_timeout: float = 60.0):
        if not cursor_table.replace("_", "").isalnum():
            raise ValueError("cursor_table must be a plain SQL name")
        if on_compacted not in ("raise", "snapshot"):
            raise ValueError('on_compacted must be "raise" or "snapshot"')
        self.client, self.conn, self.apply = client, conn, apply
        self.sku, self.scope = sku, scope if scope is not None else (sku or "*")
        self.table, self.on_compacted, self.snapshot_first = cursor_table, on_compacted, snapshot_first
        self.stream_timeout, self.since = stream_timeout, since
        p = {"qmark": ("?", "?", "?"), "format": ("%s", "%s", "%s"), "pyformat": ("%s", "%s", "%s"),
             "numeric": (":1", ":2", ":3")}[paramstyle]
        self._select = "SELECT revision, merged_cursor FROM %s WHERE scope = %s" % (cursor_table, p[0])
        self._upsert = ("INSERT INTO %s (scope, revision, merged_cursor) VALUES (%s, %s, %s) ON CONFLICT (scope) "
                        "DO UPDATE SET revision = excluded.revision, merged_cursor = excluded.merged_cursor"
                        % (cursor_table, p[0], p[1], p[2]))
        self._stop = threading.Event()
        self._stream: Any = None
        self.batches = 0
        self.reopened = 0
        c = conn.cursor()
        c.execute("CREATE TABLE IF NOT EXISTS %s (scope VARCHAR(255) PRIMARY KEY, revision BIGINT NOT NULL, "
                  "merged_cursor VARCHAR(1024) NOT NULL DEFAULT '')" % cursor_table)
        conn.commit()
        try:  # a table of an older version has no merged_cursor
            c.execute("SELECT merged_cursor FROM %s WHERE 1 = 0" % cursor_table)
            c.fetchall()
            conn.commit()
        except Exception:
            conn.rollback()
            c = conn.cursor()
            c.execute("ALTER TABLE %s ADD COLUMN merged_cursor VARCHAR(1024) NOT NULL DEFAULT ''" % cursor_table)
            conn.commit()

    def cursor(self) -> Optional[Position]:
        """The stored position, or None before the first batch: a revision (int), or the merged cursor
        (str) of a feed over several clusters."""
        c = self.conn.cursor()
        c.execute(self._select, (self.scope,))
        row = c.fetchone()
        self.conn.commit()
        if row is None:
            return None
        return row[1] if row[1] else int(row[0])

    def _commit(self, events: List[st.OrderEvent], cursor: int, merged: str = "") -> None:
        c = self.conn.cursor()
        try:
            self.apply(c, events)
            c.execute(self._upsert, (self.scope, 0 if merged else cursor, merged))
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

    def run(self, until: Optional[Union[int, str, Mapping[str, int]]] = None) -> Position:
        """Applies batches until stop(), or until the stored position reaches ``until``; returns it.

        ``until`` is a revision (e.g. an order's), or for a merged feed a
        merged cursor or a ``{cluster: revision}`` mapping: reached once every
        cluster it names is at or past its revision."""
        attempt = 0
        snapshot = False
        while not self._stop.is_set():
            cur = self.cursor()
            pos: Position = self.since if cur is None else cur
            if until is not None and _reached(pos, until):
                return pos
            snapshot = snapshot or (cur is None and self.snapshot_first)
            merged = pos if isinstance(pos, str) else ""
            stream = self.client.watch_orders(self.sku, since=0 if (snapshot or merged) else int(pos), snapshot=snapshot,
                                              timeout=self.stream_timeout, merged_since="" if snapshot else merged)
            self._stream = stream
            pending: List[st.OrderEvent] = []
            try:
                for batch in stream:
                    attempt = 0
                    if batch.snapshot and batch.cursor == 0:
                        pending.extend(batch.events)  # a snapshot page: its cursor comes on the last page
                        continue
                    self._commit(pending + list(batch.events), batch.cursor, batch.merged_cursor)
                    pending, snapshot = [], False
                    pos = batch.merged_cursor or batch.cursor
                    if until is not None and _reached(pos, until):
                        stream.cancel()
                        return pos
                    if self._stop.is_set():
                        stream.cancel()
                        break
            except errors.CursorCompacted as err:
                if self.on_compacted != "snapshot" or err.cluster or merged:
                    raise  # a merged feed has no snapshot to start again from
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
                stream.cancel()  # ended, or left by an error of apply: free it on the server
            self.reopened += 1
        c = self.cursor()
        return 0 if c is None else c
