"""The client against real stockctl serve processes (started by the Go test clients/TestPythonClient)."""

import concurrent.futures
import datetime
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc

import stockctl_client as sc
from stockctl.v1 import stock_service_pb2 as st
from stockctl.v1 import errors_pb2
from stockctl_client import errors

from . import env

# A bound on a wait for something the test caused (a process to die, a
# stream to break): never a measurement.
BOUND = 60


def client(*targets, **kw):
    env.need()
    return sc.Client(list(targets) or [env.TARGET], env.TOKEN, **kw)


class StockMethods(unittest.TestCase):
    def test_every_stock_method(self):
        with client() as c:
            sku = env.name("py-stock")
            o = lambda n: sku + "-" + n  # order IDs are unique across SKUs
            made = c.create_sku(sku, total=100, segments=4, initial_fill=40, low_watermark=2, refill_batch=5)
            self.assertEqual((made.sku, made.total, made.pool), (sku, 100, 60))
            a = c.allocate(sku, o("a-1"), 2, route_key="user-1")
            self.assertFalse(a.replayed)
            self.assertEqual(sum(p.qty for p in a.parts), 2)
            again = c.allocate(sku, o("a-1"), 2, route_key="user-1")
            self.assertTrue(again.replayed)
            self.assertEqual(again.revision, a.revision)
            r = c.reserve(sku, o("r-1"), 3, ttl=datetime.timedelta(minutes=15), buyer="user-7")
            self.assertEqual(r.state, st.ORDER_STATE_RESERVED)
            self.assertTrue(r.HasField("deadline"))
            self.assertFalse(c.confirm(sku, o("r-1")).replayed)
            self.assertTrue(c.confirm(sku, o("r-1")).replayed)
            c.reserve(sku, o("r-2"), 1, ttl=600)
            self.assertEqual(c.cancel(sku, o("r-2")).state, st.ORDER_STATE_RESERVED)
            rel = c.release(sku, o("a-1"))
            self.assertEqual((rel.qty, rel.state, rel.replayed), (2, st.ORDER_STATE_ALLOCATED, False))
            self.assertTrue(c.release(sku, o("a-1")).replayed)
            rs = c.restock(sku, 50, env.name("dn"))
            self.assertEqual((rs.total, rs.replayed), (150, False))
            self.assertTrue(c.restock(sku, 50, rs.delivery).replayed)
            s = c.status(sku)
            self.assertEqual((s.total, s.remaining, s.allocated, len(s.segments)), (150, 147, 3, 4))
            au = c.audit(sku)
            self.assertTrue(au.ok, au.problems)
            self.assertEqual((au.total, au.deliveries), (150, 1))
            frames = c.watch_status(sku, min_interval=0.01, timeout=30)
            first = next(frames)
            self.assertEqual(first.remaining, 147)
            frames.close()
            batches = c.watch_orders(sku, since=made_rev(c, sku, a.revision), timeout=30)
            events = []
            for b in batches:
                events += [(e.order, sc.kind(e)) for e in b.events]
                if b.cursor >= rel.revision:  # the last order event (the restock after it is no order's)
                    batches.cancel()
                    break
            self.assertEqual(events, [(o("a-1"), "allocated"), (o("r-1"), "reserved"), (o("r-1"), "confirmed"),
                                      (o("r-2"), "reserved"), (o("r-2"), "cancelled"), (o("a-1"), "released")])


class OrdersOfSeveralSKUs(unittest.TestCase):
    def test_all_or_nothing(self):
        with client() as c:
            a, b = env.name("py-cart-a"), env.name("py-cart-b")
            c.create_sku(a, total=10, segments=2, initial_fill=10)
            c.create_sku(b, total=1, segments=1, initial_fill=1)
            o = lambda n: a + "-" + n
            got = c.allocate_order(o("c-1"), [(a, 2), (b, 1)])
            self.assertEqual([(l.sku, l.qty) for l in got.lines], [(a, 2), (b, 1)])
            self.assertTrue(all(l.revision == got.revision for l in got.lines))
            self.assertTrue(c.allocate_order(o("c-1"), [(b, 1), (a, 2)]).replayed)
            with self.assertRaises(errors.OrderConflict):
                c.allocate_order(o("c-1"), [(a, 3), (b, 1)])
            with self.assertRaises(errors.SoldOut) as cm:
                c.allocate_order(o("c-2"), [(a, 1), (b, 1)])
            line = errors_pb2.RefusedLine.FromString(cm.exception.details["stockctl.v1.RefusedLine"])
            self.assertEqual((line.index, line.sku, line.qty), (1, b, 1))
            self.assertEqual(cm.exception.refused_line(), line)
            self.assertEqual(c.status(a).allocated, 2)  # nothing of c-2 was taken
            r = c.reserve_order(o("r-1"), [(a, 1)], ttl=600)
            self.assertEqual(r.state, st.ORDER_STATE_RESERVED)
            rel = c.release(b, o("c-1"))  # one line's SKU: the whole order goes back
            self.assertEqual((rel.qty, rel.replayed), (1, False))
            self.assertEqual(c.status(a).allocated, 1)
            for sku in (a, b):
                self.assertTrue(c.audit(sku).ok)


def made_rev(c, sku, first_order_rev):
    return first_order_rev - 1


class OrderStreams(unittest.TestCase):
    def test_many_orders_each_answered(self):
        with client() as c:
            sku = env.name("py-os")
            c.create_sku(sku, total=40, segments=4, initial_fill=40)
            orders = [("a", "%s-a-%d" % (sku, i)) for i in range(30)] + \
                     [("r", "%s-r-%d" % (sku, i)) for i in range(5)] + \
                     [("a", "%s-b-%d" % (sku, i)) for i in range(10)]

            def send(stream):
                return [stream.allocate(sku, o, 1) if k == "a" else stream.reserve(sku, o, 1, ttl=600) for k, o in orders]

            with c.order_stream() as stream:
                first = send(stream)
            ok = {orders[i][1]: f.result() for i, f in enumerate(first) if f.exception() is None}
            refused = [f.exception() for f in first if f.exception() is not None]
            self.assertEqual(len(ok), 40)
            self.assertEqual(len(refused), 5)
            for e in refused:
                self.assertIsInstance(e, sc.SoldOut)
                self.assertEqual((e.sku, e.want), (sku, 1))
                self.assertLess(e.remaining, 1)
                self.assertGreater(e.revision, 0)
            self.assertTrue(all(not r.replayed for r in ok.values()))
            self.assertEqual(sum(isinstance(r, st.ReserveResponse) for r in ok.values()),
                             sum(1 for k, o in orders if k == "r" and o in ok))
            # The same orders again: every one that was taken answers replayed, with its revision.
            with c.order_stream() as stream:
                again = send(stream)
            for (k, o), f in zip(orders, again):
                if o in ok:
                    self.assertTrue(f.result().replayed, o)
                    self.assertEqual(f.result().revision, ok[o].revision)
                else:
                    self.assertIsInstance(f.exception(), sc.SoldOut)
            self.assertEqual(c.status(sku).remaining, 0)
            self.assertEqual(c.audit(sku).orders, 40)

            limited = env.name("py-os-limit")
            c.create_sku(limited, total=10, segments=1, initial_fill=10, per_user_limit=1)
            with c.order_stream() as stream:
                a = stream.allocate(limited, limited + "-1", 1, buyer="u")
                a.result()
                b = stream.allocate(limited, limited + "-2", 1, buyer="u")
                x = stream.allocate(limited, limited + "-1", 1, buyer="v")  # another buyer for the ID
            self.assertIsInstance(b.exception(), sc.PerUserLimitExceeded)
            self.assertEqual(b.exception().limit, 1)
            self.assertIsInstance(x.exception(), sc.OrderConflict)

    def test_unanswered_orders_resent_after_a_break(self):
        with client() as c:
            sku = env.name("py-os-break")
            c.create_sku(sku, total=10, segments=2, initial_fill=10)
        lose = LoseStreamReplies(5)
        with client(interceptors=[lose]) as c:
            stream = c.order_stream()
            futures = [stream.allocate(sku, "%s-%d" % (sku, i), 1) for i in range(5)]
            concurrent.futures.wait(futures, timeout=BOUND)
            stream.close()
            # The first stream committed all five and its answers were lost with it: the second
            # stream sent them again, with the same order IDs, and each answered replayed.
            self.assertEqual(len(lose.swallowed), 5)
            first = {r.id: r.allocated for r in lose.swallowed}
            for f in futures:
                self.assertTrue(f.done(), "an order was never answered")
                self.assertTrue(f.result().replayed)
            self.assertEqual(sorted(f.result().revision for f in futures), sorted(a.revision for a in first.values()))
            self.assertEqual(c.status(sku).remaining, 5)

    def test_list_skus(self):
        with client() as c:
            prefix = env.name("py-list")
            made = sorted(prefix + "-" + n for n in ("c", "a", "b"))
            for sku in made:
                c.create_sku(sku, total=1, segments=1, initial_fill=1)
            listed = list(c.list_skus(page_size=2))
            self.assertEqual([s for s in listed if s.startswith(prefix)], made)
            self.assertEqual(listed, sorted(listed))
            self.assertEqual(len(listed), len(set(listed)))


    def test_prepare(self):
        with client() as c:
            prefix = env.name("py-prep")
            skus = [prefix + "-" + n for n in ("a", "b", "c")]
            for sku in skus:
                c.create_sku(sku, total=10, segments=2, initial_fill=10)
            p = c.prepare(skus + skus[:1])
            self.assertEqual((p.skus, p.skipped), (3, 0))
            self.assertEqual(p.ready, 3)
            with self.assertRaises(sc.SKUNotFound) as cm:
                c.prepare([skus[0], prefix + "-nope"])
            self.assertIn(prefix + "-nope", str(cm.exception))
            with self.assertRaises(sc.InvalidArgument):
                c.prepare([])
            self.assertFalse(c.allocate(skus[1], "o-1", 1).replayed)


    def test_next_expiry(self):
        with client() as c:
            sku = env.name("py-nx")
            c.create_sku(sku, total=10, segments=2, initial_fill=10)
            self.assertIsNone(c.next_expiry(sku))
            c.reserve(sku, "r-late", 1, ttl=datetime.timedelta(hours=1))
            soon = c.reserve(sku, "r-soon", 1, ttl=datetime.timedelta(minutes=1))
            self.assertEqual(c.next_expiry(sku), soon.deadline.ToDatetime())
            c.confirm(sku, "r-soon")
            c.cancel(sku, "r-late")
            self.assertIsNone(c.next_expiry(sku))
            with self.assertRaises(sc.SKUNotFound):
                c.next_expiry(env.name("py-nx-none"))
            with self.assertRaises(sc.InvalidArgument):
                c.next_expiry("a b")


class ErrorReasonsLive(unittest.TestCase):
    """Each reason a test can cause on a real serve comes back as its class."""

    def test_refusals(self):
        with client() as c:
            sku = env.name("py-err")
            c.create_sku(sku, total=5, segments=2, initial_fill=5)
            with self.assertRaises(sc.InvalidArgument) as cm:
                c.allocate(sku, "x-0", 0)
            self.assertEqual(cm.exception.field, "qty")
            with self.assertRaises(sc.SKUNotFound):
                c.status(env.name("py-none"))
            with self.assertRaises(sc.OrderNotFound):
                c.confirm(sku, "no-such-order")
            # A retry of an order prune archived is refused, never applied
            # twice; so is its release.
            with self.assertRaises(sc.OrderPruned) as cm:
                c.allocate(env.PRUNED_SKU, "gone", 1)
            e = cm.exception
            self.assertEqual((e.sku, e.order, e.code), (env.PRUNED_SKU, "gone", grpc.StatusCode.FAILED_PRECONDITION))
            self.assertIsNotNone(e.pruned)
            with self.assertRaises(sc.OrderPruned):
                c.release(env.PRUNED_SKU, "gone")
            with self.assertRaises(sc.SKUExists):
                c.create_sku(sku, total=5, segments=2, initial_fill=5)
            c.allocate(sku, "x-1", 1)
            with self.assertRaises(sc.OrderConflict):
                c.allocate(sku, "x-1", 2)
            with self.assertRaises(sc.OrderStateConflict):
                c.confirm(sku, "x-1")
            d = env.name("dn")
            c.restock(sku, 1, d)
            with self.assertRaises(sc.DeliveryConflict):
                c.restock(sku, 2, d)
            with self.assertRaises(sc.SoldOut) as cm:
                c.allocate(sku, "x-2", 99)
            e = cm.exception
            self.assertEqual((e.sku, e.want, e.remaining), (sku, 99, 5))
            self.assertGreater(e.revision, 0)
            self.assertEqual((e.code, e.reason), (grpc.StatusCode.FAILED_PRECONDITION, "INSUFFICIENT_STOCK"))

            limited = env.name("py-limit")
            c.create_sku(limited, total=10, segments=1, initial_fill=10, per_user_limit=2)
            c.allocate(limited, "l-1", 2, buyer="user-9")
            with self.assertRaises(sc.PerUserLimitExceeded) as cm:
                c.allocate(limited, "l-2", 1, buyer="user-9")
            e = cm.exception
            self.assertEqual((e.buyer, e.limit, e.held, e.want), ("user-9", 2, 2, 1))

            r = c.reserve(sku, "x-3", 1, ttl=1)
            deadline = r.deadline.ToDatetime().replace(tzinfo=datetime.timezone.utc)
            # Waits for the reservation's deadline (the server's clock is this machine's).
            time.sleep(max(0.0, (deadline - datetime.datetime.now(datetime.timezone.utc)).total_seconds()) + 0.2)
            with self.assertRaises(sc.ReservationExpired) as cm:
                c.confirm(sku, "x-3")
            self.assertEqual(cm.exception.order, "x-3")
            self.assertEqual(cm.exception.deadline, r.deadline.ToDatetime())

            with self.assertRaises(sc.CursorAhead) as cm:
                c.watch_orders(sku, since=10 ** 12).__next__()
            self.assertEqual(cm.exception.cursor, 10 ** 12)
            with self.assertRaises(sc.CursorCompacted) as cm:
                next(iter(c.watch_orders("", since=1)))
            self.assertGreaterEqual(cm.exception.compact_revision, env.COMPACTED)
            with self.assertRaises(sc.ResourceExhausted):  # BODY_TOO_LARGE, or the transport's bound
                c.allocate("s" * 100000, "x-4", 1)

    def test_tokens(self):
        env.need()
        with sc.Client(env.TARGET) as anon, self.assertRaises(sc.TokenMissing):
            anon.status("any")
        with sc.Client(env.TARGET, "not-the-token-0123456789") as wrong, self.assertRaises(sc.TokenInvalid):
            wrong.status("any")

    def test_lock_refusals(self):
        with client() as c:
            name = env.name("py-busy")
            with c.lock(name, ttl=30):
                with self.assertRaises(sc.LockBusy) as cm:
                    c.acquire(name, wait=0)
                self.assertEqual(cm.exception.name, name)
                with client(timeout=1) as short, self.assertRaises(sc.DeadlineExceeded):
                    short.acquire(name)  # waits for the lock until the call's deadline
            sem = env.name("py-sem")
            with c.lock(sem, kind="semaphore", limit=2):
                with self.assertRaises(sc.LimitMismatch) as cm:
                    c.acquire(sem, kind="semaphore", limit=3)
                self.assertEqual((cm.exception.limit, cm.exception.held_limit), (3, 2))
            with self.assertRaises(sc.LockKindUnsupported):
                c.acquire(env.name("py-kind"), kind=99)
            with self.assertRaises(sc.HoldNotFound):
                c.keep_alive("h_NOSUCHHOLD")
            lapse = env.name("py-lapse")
            held = c.acquire(lapse, ttl=1)
            # No KeepAlive: wait until the server has let the hold go, seen as the lock being free
            # (a KeepAlive that beat the server's own timer would extend it).
            deadline = time.monotonic() + BOUND
            while True:
                try:
                    c.release_hold(c.acquire(lapse, wait=0).hold_id)
                    break
                except sc.LockBusy:
                    self.assertLess(time.monotonic(), deadline, "the server never let the hold go")
                    time.sleep(0.1)
            with self.assertRaises(sc.LockLost) as cm:
                c.keep_alive(held.hold_id)
            self.assertEqual((cm.exception.token, cm.exception.lost_reason), (held.token, "KEEPALIVE_TIMEOUT"))


class Locks(unittest.TestCase):
    def test_hold_stream_kept_alive(self):
        with client() as c:
            name = env.name("py-lock")
            with c.lock(name, ttl=1) as held:
                self.assertGreater(held.token, 0)
                self.assertTrue(held.key)
                # Three ttls without the caller doing anything: the background keep-alive holds it.
                self.assertFalse(held.lost.wait(3))
                held.check()
                with self.assertRaises(sc.LockBusy):
                    c.acquire(name, wait=0)
            first = held.token
            with c.lock(name, kind="shared") as a, c.lock(name, kind="shared") as b:
                self.assertGreater(min(a.token, b.token), first)
            u = c.acquire(name, ttl=10)
            self.assertGreater(u.token, max(a.token, b.token))
            self.assertEqual(c.keep_alive(u.hold_id).token, u.token)
            self.assertEqual(c.release_hold(u.hold_id).token, u.token)
            self.assertEqual(c.release_hold(u.hold_id).token, u.token)  # idempotent
            # An Acquire retried with its request_id answers the hold it was granted.
            rid = env.name("rid") + "-0123456789abcdef"
            h1 = c.acquire(name, ttl=10, request_id=rid)
            h2 = c.acquire(name, ttl=10, request_id=rid)
            self.assertTrue(h2.replayed)
            self.assertEqual((h2.hold_id, h2.token), (h1.hold_id, h1.token))
            self.assertEqual(c.release_hold(request_id=rid).token, h1.token)
            self.assertTrue(c.release_hold(request_id=env.name("never") + "-0123456789abcdef").withdrawn)

    def test_lost_when_keepalives_stop(self):
        with client() as c:
            held = c.lock(env.name("py-stall"), ttl=1)
            held.acquire()
            held._done.set()  # stops the keep-alives, as a stalled process would
            self.assertTrue(held.lost.wait(BOUND), "the server never reported the hold lost")
            self.assertEqual(held.lost_error.lost_reason, "KEEPALIVE_TIMEOUT")
            with self.assertRaises(sc.LockLost):
                held.release()


class LoseFirstReply(grpc.UnaryUnaryClientInterceptor):
    """Lets the first Allocate reach the server and commit, then loses its reply."""

    def __init__(self):
        self.lost = []

    def intercept_unary_unary(self, continuation, details, request):
        outcome = continuation(details, request)
        if details.method.endswith("/Allocate") and not self.lost:
            self.lost.append(outcome.result())
            raise _Unavailable()
        return outcome


class LoseStreamReplies(grpc.StreamStreamClientInterceptor):
    """Lets the first OrderStream's orders commit, swallows their n answers (counted one by one,
    also those a message carries in `more`), then breaks the stream."""

    def __init__(self, n):
        self.n, self.swallowed, self.used = n, [], False

    def intercept_stream_stream(self, continuation, details, request_iterator):
        call = continuation(details, request_iterator)
        if self.used or not details.method.endswith("/OrderStream"):
            return call
        self.used = True

        def responses():  # yields nothing: every answer of this stream is lost
            for msg in call:
                # A message carries its own answer and those in `more`.
                self.swallowed.extend(r for r in [msg, *msg.more] if r.WhichOneof("outcome"))
                if len(self.swallowed) >= self.n:
                    call.cancel()
                    raise _Unavailable()
            yield from ()
        return responses()


class _Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "the reply was lost (test)"

    def trailing_metadata(self):
        return ()


class ServeKilled(unittest.TestCase):
    def test_retry_on_second_serve_and_lock_lost(self):
        env.need()
        self.assertTrue(env.SPARE and env.SPARE_PID, "no spare serve to kill")
        with client() as a:
            sku = env.name("py-kill")
            a.create_sku(sku, total=10, segments=2, initial_fill=10)
        lose = LoseFirstReply()
        lost_calls = []
        with client(env.SPARE, env.TARGET, interceptors=[lose]) as c, client(env.SPARE) as on_spare, \
                client(env.SPARE, env.TARGET) as streams:
            # An order whose reply is lost on the spare is retried on the other serve: replayed.
            got = c.allocate(sku, "k-1", 3)
            self.assertEqual(len(lose.lost), 1)
            self.assertTrue(got.replayed)
            self.assertEqual(got.revision, lose.lost[0].revision)
            self.assertEqual(c.targets[c._target()], env.TARGET)
            self.assertEqual(on_spare.status(sku).remaining, 7)

            # An order stream on the spare: its first orders are answered there.
            stream = streams.order_stream()
            before = [stream.allocate(sku, "%s-s-%d" % (sku, i), 1) for i in range(2)]
            self.assertTrue(all(not f.result().replayed for f in before))

            held = on_spare.lock(env.name("py-dropped"), ttl=60, on_lost=lost_calls.append)
            with self.assertRaises(sc.LockLost) as cm:
                with held:
                    os.kill(env.SPARE_PID, signal.SIGKILL)
                    self.assertTrue(held.lost.wait(BOUND), "the lock was not reported lost when its stream dropped")
            e = cm.exception
            self.assertEqual((e.name, e.token, e.lost_reason), (held.name, held.token, "STREAM_BROKEN"))
            self.assertEqual(lost_calls, [e])

            # The spare is dead: once the stream has seen it (whether before or while orders
            # are sent is the race this wait removes), orders go to the other serve on a new stream.
            deadline = time.monotonic() + BOUND
            while stream._outbox is not None and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertIsNone(stream._outbox, "the order stream did not see its serve die")
            after = [stream.allocate(sku, "%s-s-%d" % (sku, i), 1) for i in range(2, 4)]
            self.assertTrue(all(not f.result().replayed for f in after))
            self.assertEqual(streams.targets[streams._target()], env.TARGET)
            stream.close()

        # The spare is dead: a new client's first attempt fails there and goes on to the other serve.
        with client(env.SPARE, env.TARGET) as c:
            self.assertFalse(c.allocate(sku, "k-2", 1).replayed)
            self.assertEqual(c.targets[c._target()], env.TARGET)
            self.assertEqual(c.status(sku).remaining, 2)
        with client(env.SPARE, attempts=2) as dead, self.assertRaises(sc.Unavailable):
            dead.status(sku)


class FeedConsumer(unittest.TestCase):
    def test_killed_and_resumed_exactly(self):
        with client() as c:
            sku = env.name("py-feed")
            c.create_sku(sku, total=1000, segments=4, initial_fill=400)
            start = c.status(sku).revision
            db = os.path.join(tempfile.mkdtemp(), "feed.db")
            script = os.path.join(os.path.dirname(__file__), "feed_consumer.py")

            def place(n, tag):
                last = 0
                for i in range(n):
                    o = "%s-%s-%d" % (sku, tag, i)
                    if i % 3 == 0:
                        last = c.reserve(sku, o, 1, ttl=600).revision
                        if i % 2 == 0:
                            last = c.confirm(sku, o).revision
                        else:
                            last = c.cancel(sku, o).revision
                    else:
                        last = c.allocate(sku, o, 2).revision
                        if i % 5 == 0:
                            last = c.release(sku, o).revision
                return last

            def consume(until, crash_after=0):
                e = dict(os.environ, CRASH_AFTER=str(crash_after))
                return subprocess.run([sys.executable, script, env.TARGET, env.TOKEN, db, sku, str(start), str(until)],
                                      env=e, capture_output=True, text=True, timeout=BOUND * 5)

            until = place(30, "a")
            p = consume(until, crash_after=7)
            self.assertEqual(p.returncode, -signal.SIGKILL, p.stdout + p.stderr)
            until = place(30, "b")
            p = consume(until, crash_after=25)
            self.assertEqual(p.returncode, -signal.SIGKILL, p.stdout + p.stderr)
            p = consume(until, crash_after=3)
            self.assertEqual(p.returncode, -signal.SIGKILL, p.stdout + p.stderr)
            until = place(20, "c")
            p = consume(until)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

            # What the table holds is the feed from the start, each event once, in order.
            want = []
            stream = c.watch_orders(sku, since=start, timeout=BOUND)
            for b in stream:
                want += [(e.revision, e.order, sc.kind(e)) for e in b.events]
                if b.cursor >= until:
                    stream.cancel()
                    break
            conn = sqlite3.connect(db)
            got = conn.execute("SELECT revision, order_id, kind FROM events ORDER BY revision, order_id").fetchall()
            self.assertEqual(got, want)
            self.assertGreater(len(want), 80)
            cursor = conn.execute("SELECT revision FROM stockctl_feed_cursor WHERE scope = ?", (sku,)).fetchone()[0]
            self.assertGreaterEqual(cursor, until)
            states = dict(conn.execute("SELECT state, COUNT(*) FROM orders GROUP BY state").fetchall())
            au = c.audit(sku)
            self.assertEqual(sum(states.values()), au.orders)
            self.assertEqual(states.get("released", 0) + states.get("cancelled", 0), au.released_orders)


if __name__ == "__main__":
    unittest.main()
