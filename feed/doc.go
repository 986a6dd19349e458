// Package feed hands a sale's orders to a system of record: every change
// to an order, in the order etcd committed them, from a cursor you store,
// exactly once.
//
// A flash sale runs on etcd (package coordinator); the orders belong in
// your database afterwards, and during the sale too. A feed gives you each
// change to an order as an Event (allocated, reserved, confirmed,
// cancelled, released, expired) with the order's ID, SKU, quantity, buyer,
// parts and deadline, and the etcd revision that made it:
//
//	f, err := feed.Open(ctx, client, feed.Config{SKU: "iphone", Since: cursor})
//	if err != nil { ... }
//	defer f.Close()
//	for {
//		b, err := f.Next(ctx)
//		if err != nil { ... }  // *CompactedError: start again from Snapshot
//		// In ONE database transaction: upsert every b.Events[i] by order ID,
//		// and store b.Cursor. A crash before the commit leaves the old
//		// cursor, and the same events come again.
//	}
//
// # Order and cursors
//
// Events come in revision order, and within a revision by SKU, then order
// ID. Several events can share a revision: a coordinator commits many
// orders in one transaction, and the expiry sweep expires many at once.
// Next delivers whole revisions only, never part of one.
//
// A cursor is an etcd revision R, meaning "every event up to revision R
// has been applied". A feed opened with Since: R delivers exactly the
// events with a revision greater than R: none is skipped and none comes
// twice. So store a Batch's Cursor with the events you applied, in the
// same transaction, and resume from it. Since: 0 starts at the beginning
// of etcd's history. A cursor ahead of etcd's current revision cannot come
// from this etcd, and is refused (ErrCursorAhead), never waited for.
//
// The cursor only moves with events of the feed's scope: a feed of a SKU
// that has gone quiet keeps the revision of its last event.
//
// # Compaction and snapshots
//
// etcd keeps history only back to its last compaction: a production
// cluster compacts with --auto-compaction-retention, an operator with
// etcdctl compact or stockctl reclaim, and `stockctl serve`'s embedded etcd
// compacts history older than its --auto-compaction-retention (1h by
// default). A cursor older than that is a *CompactedError (ErrCompacted),
// carrying the compact revision: the events after the cursor are gone.
// Start again from Snapshot: every order record at one revision, each as
// an event of its current state, with that revision as the Cursor; apply
// it as the latest state of each order, then follow a feed from its
// Cursor.
//
// # What an event means
//
// Each write to an order record is one event; its Kind follows from the
// record alone:
//
//	allocated  placed by Allocate            (state "", not released)
//	reserved   placed by Reserve             (state reserved, not released)
//	confirmed  Confirm of a reservation      (state confirmed)
//	cancelled  Cancel, or Release of a live reservation (state reserved, released)
//	released   Release of an allocated or confirmed order (released)
//	expired    the reservation's deadline passed unconfirmed (state expired)
//
// The Kind is also the order's state after the event: a table keyed by
// order ID that keeps each order's latest event is the orders as etcd has
// them. Apply an event only if its Revision is greater than the row's, and
// a replayed batch (or a snapshot taken after some events were applied)
// changes nothing.
//
// Deleted order records are not events: the coordinator never deletes
// one, and a prune that archives old orders by deleting them does not
// change what happened to them. The feed passes deletes over (they move
// the cursor, nothing else); a snapshot does not contain deleted orders.
//
// # Broken watches
//
// The feed reads an etcd watch. When it breaks (a member restarts, the
// cluster loses its leader, the connection drops), Next opens it again
// right after its cursor, on any member, and goes on: no event is lost or
// repeated. Restarts counts these. Only a compaction past the cursor, an
// order record that does not decode, or etcd's refusal (permissions) end a
// Next with an error.
//
// docs/feed.md has the SQL consumer recipe (SQLite, PostgreSQL, MySQL) and
// measured figures; examples/feedsql is a consumer that survives SIGKILL.
package feed
