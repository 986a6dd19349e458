// Command feedsql applies stockctl's order feed to a SQL table, exactly
// once: it is the example consumer of package feed.
//
//	feedsql --endpoints 127.0.0.1:2379 --db orders.db [--sku iphone] [--until-now]
//
// It keeps one row per order in the table orders, keyed by order ID, with
// the order's latest state (the kind of its latest event: allocated,
// reserved, confirmed, cancelled, released, expired) and the etcd revision
// of that event; and its cursor in the table feed_cursor. Every batch of
// events is applied in one database transaction that upserts the rows and
// moves the cursor, so the table and the cursor always agree: killed at any
// point (SIGKILL included) and started again, it resumes from the cursor
// and ends with exactly the orders etcd has. An upsert changes a row only
// for a newer revision, so applying anything twice changes nothing.
//
// When the cursor is older than etcd's compaction, it applies a snapshot of
// every order instead (one transaction, cursor included) and follows on
// from there.
//
// With --until-now it applies every event up to the revision etcd is at
// when it starts, and exits 0; without, it follows the sale until
// interrupted. It prints one line per committed transaction.
//
// The same recipe works on PostgreSQL and MySQL: see docs/feed.md. The
// environment variable FEEDSQL_CRASH_AFTER=N makes it kill itself with
// SIGKILL after writing N rows, inside a transaction: the tests use it to
// crash it in the middle of a batch.
package main
