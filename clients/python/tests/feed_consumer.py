"""A consumer of one SKU's order feed into SQLite, run as its own process
by test_live.FeedConsumer: python3 feed_consumer.py TARGET TOKEN DB SKU SINCE UNTIL.

With CRASH_AFTER=N in the environment it SIGKILLs itself after applying N
events, in the middle of a batch's open transaction: the test checks that
the next run resumes exactly where the last committed batch ended."""

import os
import signal
import sqlite3
import sys

from stockctl_client import Client, OrderFeedConsumer, kind

target, token, db, sku, since, until = sys.argv[1:7]
crash_after = int(os.environ.get("CRASH_AFTER", "0"))
applied = [0]

conn = sqlite3.connect(db)
conn.execute("CREATE TABLE IF NOT EXISTS orders (order_id TEXT PRIMARY KEY, state TEXT NOT NULL, "
             "qty INTEGER NOT NULL, revision INTEGER NOT NULL)")
# Every event once: a second delivery of an event breaks this primary key.
conn.execute("CREATE TABLE IF NOT EXISTS events (revision INTEGER NOT NULL, order_id TEXT NOT NULL, "
             "kind TEXT NOT NULL, PRIMARY KEY (revision, order_id))")
conn.commit()


def apply(cur, events):
    for e in events:
        cur.execute("INSERT INTO orders (order_id, state, qty, revision) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (order_id) DO UPDATE SET state = excluded.state, revision = excluded.revision "
                    "WHERE excluded.revision > orders.revision", (e.order, kind(e), e.qty, e.revision))
        cur.execute("INSERT INTO events (revision, order_id, kind) VALUES (?, ?, ?)", (e.revision, e.order, kind(e)))
        applied[0] += 1
        if crash_after and applied[0] >= crash_after:
            os.kill(os.getpid(), signal.SIGKILL)


with Client(target, token) as client:
    consumer = OrderFeedConsumer(client, conn, apply, sku=sku, since=int(since))
    cursor = consumer.run(until=int(until))
print("consumer: cursor %d after %d events" % (cursor, applied[0]))
