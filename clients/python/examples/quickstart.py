# A sale through stockctl serve with the Python client:
#   python3 quickstart.py 127.0.0.1:7070 TOKEN
import sqlite3
import sys
import uuid

from stockctl_client import Client, LockLost, OrderFeedConsumer, SoldOut, kind

target, token = sys.argv[1], sys.argv[2]
sku = "mug-" + uuid.uuid4().hex[:8]  # a fresh SKU each run

with Client(target, token) as client:  # Client([a, b], token): retries fail over
    client.create_sku(sku, total=10, segments=2, initial_fill=10)

    # An order; UNAVAILABLE, CANCELLED and DEADLINE_EXCEEDED are retried
    # with the same order ID, so a lost reply cannot take the stock twice.
    a = client.allocate(sku, order=sku + "-1", qty=2, route_key="user-42")
    print("allocated", a.qty, "from", [(p.place, p.qty) for p in a.parts])
    again = client.allocate(sku, order=sku + "-1", qty=2, route_key="user-42")
    assert again.replayed and again.revision == a.revision

    # A refusal's reason is its exception class, its detail its attributes.
    try:
        client.allocate(sku, order=sku + "-2", qty=50)
    except SoldOut as e:
        print("sold out: want", e.want, "have", e.remaining, "at revision", e.revision)

    # A lock: kept alive in the background; pass the fencing token to the
    # store it protects. Leaving the block raises LockLost if it was lost.
    try:
        with client.lock("nightly-report", ttl=30) as held:
            print("holding nightly-report with fencing token", held.token)
            held.check()  # raises LockLost at once if the hold was lost
    except LockLost as e:
        print("lost the lock:", e.lost_reason)

    # The order feed into SQLite: each batch's rows and its cursor commit in
    # one transaction, so a consumer killed anywhere resumes exactly.
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE orders (order_id TEXT PRIMARY KEY, state TEXT, qty INTEGER, revision INTEGER)")

    def apply(cur, events):
        for e in events:
            cur.execute("INSERT INTO orders VALUES (?, ?, ?, ?) ON CONFLICT (order_id) DO UPDATE "
                        "SET state = excluded.state, revision = excluded.revision "
                        "WHERE excluded.revision > orders.revision", (e.order, kind(e), e.qty, e.revision))

    feed = OrderFeedConsumer(client, db, apply, sku=sku, snapshot_first=True)
    feed.run(until=a.revision)  # a service runs it without `until`, for ever
    print("feed:", db.execute("SELECT order_id, state, qty FROM orders").fetchall(), "cursor", feed.cursor())
print("quickstart: ok")
