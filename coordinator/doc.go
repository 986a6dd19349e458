// Package coordinator is stockctl's library: fenced distributed locks on
// etcd, and segmented stock for hot SKUs built on them.
//
// Create one Coordinator per etcd client and share it across the process:
//
//	c, err := coordinator.New(client)           // one lease, renewed in the background
//	defer c.Close()                             // releases everything, revokes the lease
//
// # Locks
//
// Lock and TryLock take a named lock. Goroutines of one process queue
// locally (FIFO) and only one of them owns the lock's etcd key at a time;
// processes queue in etcd in arrival order. A lock released while other
// goroutines of the same process wait is handed to the next one without a
// round trip, within the bounds of WithCohort. Locks are reentrant through
// the holder's context (Lock.Context, Lock.Bind).
//
// A held lock can be lost (the process paused past its lease, or was cut
// off from etcd). Lock.Done and Lock.Context say so once this process
// notices; to make writes safe regardless, write in a transaction fenced by
// the lock (Lock.Txn, or Lock.IsOwner in your own If): etcd applies it only
// while the lock is really held. Lock.Token is a fencing token for stores
// outside etcd.
//
// # Segmented stock
//
// CreateSKU splits a SKU's stock into N segments, each guarded by its own
// lock, plus a central pool. Allocate routes an order to a segment by a
// hash of its route key and deducts there in one transaction fenced by the
// segment's lock, which also records the order; when the segment cannot
// serve, the order falls back to the pool, to the other segments, and last
// to gathering from several places at once. An order is refused
// (ErrInsufficientStock) only when the whole SKU held too little at one
// revision. Allocations are idempotent by order ID; Release returns an
// order's stock; Restock adds a delivery; Status and Audit read the books
// at one revision. The rebalance package keeps segments stocked from the
// pool.
//
// The invariant every operation keeps, at every etcd revision:
//
//	total = pool + Σ segments (counter + inbox) + Σ active orders
//
// All etcd keys live under a prefix (WithPrefix); see internal/keys for
// the layout.
package coordinator
