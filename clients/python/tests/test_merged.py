"""OrderFeedConsumer against serves over two etcd clusters (started by the Go test
clients/TestPythonClient): every SKU's feed is the clusters' feeds merged, its position the
merged cursor, which the consumer stores in the caller's transaction and resumes from."""

import os
import signal
import sqlite3
import tempfile
import threading
import time
import unittest

import stockctl_client as sc

from . import env

BOUND = 60


def client(*targets, **kw):
    env.need()
    if not env.MERGED:
        raise RuntimeError("STOCKCTL_MERGED_TARGET is not set: run these tests with `go test ./clients/`")
    return sc.Client(list(targets) or [env.MERGED], env.TOKEN, **kw)


def place(c, tag, n=12):
    """Orders of every kind of transition on the SKU of each cluster; the last revision of each cluster."""
    last = {}
    for cluster, sku in (("a", env.SKU_A), ("b", env.SKU_B)):
        for i in range(n):
            o = "%s-%d" % (tag, i)
            if i % 3 == 0:
                r = c.reserve(sku, o, 1, ttl=600).revision
                r = (c.confirm(sku, o) if i % 2 == 0 else c.cancel(sku, o)).revision
            else:
                r = c.allocate(sku, o, 1).revision
                if i % 4 == 1:
                    r = c.release(sku, o).revision
            last[cluster] = r
    return last


def start():
    """The merged cursor a consumer starts from: cluster a after its compaction, b from its start."""
    return "a=%d" % env.COMPACTED_A


class Table:
    """A SQLite table of events, each (sku, order, kind) once: a repeat breaks its primary key."""

    def __init__(self):
        self.path = os.path.join(tempfile.mkdtemp(), "merged.db")
        self.conn = sqlite3.connect(self.path, check_same_thread=False)
        self.conn.execute("CREATE TABLE events (sku TEXT NOT NULL, order_id TEXT NOT NULL, kind TEXT NOT NULL, "
                          "revision INTEGER NOT NULL, PRIMARY KEY (sku, order_id, kind))")
        self.conn.commit()
        self.fail_after = 0  # > 0: apply raises after that many more events, inside the batch's transaction
        self.applied = 0

    def apply(self, cur, events):
        for e in events:
            cur.execute("INSERT INTO events VALUES (?, ?, ?, ?)", (e.sku, e.order, sc.kind(e), e.revision))
            self.applied += 1
            if self.fail_after:
                self.fail_after -= 1
                if self.fail_after == 0:
                    raise RuntimeError("the consumer dies in the middle of a batch")

    def rows(self):
        conn = sqlite3.connect(self.path)
        try:
            return sorted(conn.execute("SELECT sku, order_id, kind, revision FROM events").fetchall())
        finally:
            conn.close()

    def stored(self):
        conn = sqlite3.connect(self.path)
        try:
            return conn.execute("SELECT revision, merged_cursor FROM stockctl_feed_cursor WHERE scope = '*'").fetchone()
        finally:
            conn.close()


def feed_from(c, since, until):
    """Every event of the merged feed after since up to until (per cluster), read afresh."""
    got = []
    stream = c.watch_orders(merged_since=since, timeout=BOUND)
    for b in stream:
        got += [(e.sku, e.order, sc.kind(e), e.revision) for e in b.events]
        pos = sc.parse_merged_cursor(b.merged_cursor)
        if all(pos.get(k, 0) >= v for k, v in until.items()):
            stream.cancel()
            break
    return sorted(got)


class MergedFeedConsumer(unittest.TestCase):
    def test_resumes_across_a_crash_and_a_killed_serve_exactly(self):
        self.assertTrue(env.MERGED_SPARE and env.MERGED_SPARE_PID, "no spare serve over the clusters to kill")
        with client() as c, client(env.MERGED_SPARE, env.MERGED) as fc:
            t = Table()
            consumer = sc.OrderFeedConsumer(fc, t.conn, t.apply, since=start(), stream_timeout=BOUND)
            until = place(c, env.name("m1"))
            # A consumer that dies in the middle of a batch rolls it back with its transaction ...
            t.fail_after = 3
            with self.assertRaises(RuntimeError):
                consumer.run(until=until)
            self.assertLess(len(t.rows()), 3)
            # ... and the next run applies it again, whole, from the stored merged cursor.
            pos = consumer.run(until=until)
            self.assertIsInstance(pos, str)
            self.assertEqual(consumer.cursor(), pos)
            rev, merged = t.stored()
            self.assertEqual((rev, merged), (0, pos))
            got = sc.parse_merged_cursor(pos)
            self.assertEqual(set(got), {"a", "b"})
            self.assertTrue(got["a"] >= until["a"] and got["b"] >= until["b"], (got, until))

            # A consumer following the spare serve when it is killed goes on on the other, from its cursor.
            done = threading.Event()
            result = []

            def follow():
                try:
                    result.append(consumer.run())
                except BaseException as e:  # the test fails on it below
                    result.append(e)
                finally:
                    done.set()

            th = threading.Thread(target=follow, daemon=True)
            th.start()
            time.sleep(0.5)  # its stream is open on the spare
            os.kill(env.MERGED_SPARE_PID, signal.SIGKILL)
            until = place(c, env.name("m2"))
            deadline = time.monotonic() + BOUND
            while time.monotonic() < deadline:
                row = t.stored()
                if row and sc.feed._reached(row[1], until):
                    break
                time.sleep(0.05)
            consumer.stop()
            self.assertTrue(done.wait(BOUND), "the consumer did not stop")
            self.assertNotIsInstance(result[0], BaseException, result)
            self.assertGreaterEqual(consumer.reopened, 1)
            self.assertEqual(fc.targets[fc._target()], env.MERGED)

            # The table holds the feed from the start cursor, each event once: nothing lost, nothing repeated.
            want = feed_from(c, start(), sc.parse_merged_cursor(t.stored()[1]))
            self.assertEqual(t.rows(), want)
            self.assertGreater(len(want), 40)
            self.assertEqual({r[0] for r in want}, {env.SKU_A, env.SKU_B})

    def test_refused_cursors_are_typed(self):
        with client() as c:
            # A cursor of cluster a older than its compacted history.
            with self.assertRaises(sc.CursorCompacted) as cm:
                for _ in c.watch_orders(merged_since="a=1", timeout=BOUND):
                    pass
            e = cm.exception
            self.assertEqual((e.cluster, e.cursor, e.compact_revision), ("a", 1, env.COMPACTED_A))
            # A consumer resuming from it raises it too: a merged feed has no snapshot to start again from.
            t = Table()
            consumer = sc.OrderFeedConsumer(c, t.conn, t.apply, since="a=1,b=0", on_compacted="snapshot",
                                            stream_timeout=BOUND)
            with self.assertRaises(sc.CursorCompacted) as cm:
                consumer.run()
            self.assertEqual(cm.exception.cluster, "a")
            # Cluster b's batches may have come (and been stored) first: a's position stays where it was.
            stored = t.stored()
            self.assertTrue(stored is None or sc.parse_merged_cursor(stored[1])["a"] == 1, stored)

            # A cursor naming a cluster the server does not have (removed from its list).
            t = Table()
            consumer = sc.OrderFeedConsumer(c, t.conn, t.apply, since=start() + ",gone=7", stream_timeout=BOUND)
            with self.assertRaises(sc.MergedCursorRefused) as cm:
                consumer.run()
            e = cm.exception
            self.assertIsInstance(e, sc.InvalidArgument)
            self.assertEqual((e.cluster, e.field, e.reason), ("gone", "merged_since", "INVALID_ARGUMENT"))
            # A malformed cursor stays a plain InvalidArgument.
            with self.assertRaises(sc.InvalidArgument) as cm:
                for _ in c.watch_orders(merged_since="nonsense", timeout=BOUND):
                    pass
            self.assertNotIsInstance(cm.exception, sc.MergedCursorRefused)

    def test_one_skus_feed_keeps_a_revision_cursor(self):
        with client() as c:
            until = place(c, env.name("m3"), n=3)
            t = Table()
            consumer = sc.OrderFeedConsumer(c, t.conn, t.apply, sku=env.SKU_B, since=0, stream_timeout=BOUND)
            pos = consumer.run(until=until["b"])
            self.assertIsInstance(pos, int)
            self.assertGreaterEqual(pos, until["b"])
            conn = sqlite3.connect(t.path)
            self.assertEqual(conn.execute("SELECT revision, merged_cursor FROM stockctl_feed_cursor").fetchone(), (pos, ""))
            self.assertEqual({r[0] for r in t.rows()}, {env.SKU_B})

    def test_list_skus_names_each_skus_cluster(self):
        with client() as c:
            where = dict(c.list_sku_clusters(page_size=1))
            self.assertEqual((where[env.SKU_A], where[env.SKU_B]), ("a", "b"))
            self.assertEqual(list(where), list(c.list_skus()))
        with sc.Client(env.TARGET, env.TOKEN) as one:
            self.assertEqual({cl for _, cl in one.list_sku_clusters()}, {""})

    def test_old_cursor_table_gains_the_column(self):
        with client() as c:
            t = Table()
            t.conn.execute("CREATE TABLE stockctl_feed_cursor (scope TEXT PRIMARY KEY, revision BIGINT NOT NULL)")
            t.conn.execute("INSERT INTO stockctl_feed_cursor VALUES (?, ?)", (env.SKU_A, 1 << 40))
            t.conn.commit()
            consumer = sc.OrderFeedConsumer(c, t.conn, t.apply, sku=env.SKU_A)
            self.assertEqual(consumer.cursor(), 1 << 40)


if __name__ == "__main__":
    unittest.main()
