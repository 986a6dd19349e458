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
// Lock takes a named lock (with TryFor, it gives up after a wait budget).
// Goroutines of one process queue locally (FIFO) and only one of them owns
// the lock's etcd key at a time; processes queue in etcd in arrival order. A lock released while other
// goroutines of the same process wait is handed to the next one without a
// round trip, within the bounds of WithCohort. Locks are reentrant through
// the holder's context (Lock.Context, Lock.Bind).
//
// RLock takes the same named lock shared (a read-write lock): shared
// holders hold it together, never beside an exclusive one, and a shared
// request that comes after a queued exclusive one waits for it.
// AcquirePermit takes one of the limit permits of a named semaphore. Both
// take TryFor too, and both return a Lock with every guarantee below.
// WithLockDelay keeps a lock lost without release from everyone for a while,
// for resources that cannot check a fencing token. Locks lists holders and
// waiters.
//
// A held lock can be lost (the process paused past its lease, or was cut
// off from etcd, or its key was deleted). Lock.Done and Lock.Context say so
// once this process notices; to make writes safe regardless, write in a
// transaction fenced by the lock (Lock.Txn, or Lock.IsOwner in your own If):
// etcd applies it only while the lock is really held. Lock.Token is a
// fencing token for stores outside etcd, larger for every exclusive hold
// than for any hold before it (shared holds and permits: per key).
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
//
// # Where things are
//
// This package is the facade a service imports. The lock engine (sessions,
// local queues, retained segment locks, the etcd key protocol) is
// internal/lock; the segment engine (the order path, group commits, moves,
// returns, expiry, the books) is package segments, whose types the stock
// operations return (aliased here); the rebalancer is package rebalance.
// docs/architecture.md has the map and the path of one order.
//
// # Metrics
//
// WithMetrics(reg) registers these Prometheus metrics (the rebalancer's
// are rebalance.Rebalancer.Collector; docs/metrics.md lists every metric
// stockctl exports and what each counts). Label values are fixed sets, except
// the stock gauges' SKU and place, bounded by MetricsMaxSKUs.
//
//	stockctl_lock_wait_seconds{lock,outcome}        histogram: waits for a lock; lock is segment, pool,
//	                                                named (exclusive named locks), shared or semaphore;
//	                                                outcome acquired, busy, timeout, canceled, lost or
//	                                                error
//	stockctl_lock_hold_seconds{lock,end}            histogram: how long holds of named locks lasted; lock
//	                                                is named, shared or semaphore; end released or lost
//	stockctl_lock_holders{lock}                     gauge: holds of named locks in progress in this process
//	stockctl_lock_delays_total{lock}                acquisitions that waited out a lock-delay
//	stockctl_lock_handoffs_total{lock,via}          locks passed to a holder: via local (another goroutine
//	                                                of this process, no etcd write) or etcd (from another
//	                                                process, or free)
//	stockctl_sessions_started_total                 etcd sessions (leases) started
//	stockctl_session_losses_total                   sessions lost in use (every lock held under one lost)
//	stockctl_session_late_renewals_total            keepalives answered late: more than halfway from the
//	                                                longest healthy gap (granted TTL/3 + 0.5 s) to the TTL
//	stockctl_allocations_total{op,outcome,source}   orders taking stock: op allocate (Allocate,
//	                                                AllocateFunc) or reserve; outcome served, replayed,
//	                                                insufficient, limit_exceeded, conflict or error;
//	                                                source segment, pool or gather when served, else none
//	stockctl_allocated_units_total{source}          units deducted by served orders
//	stockctl_releases_total{op,outcome}             op release or cancel; outcome released,
//	                                                already_released, expired, conflict, not_found, error
//	stockctl_confirms_total{outcome}                confirmed, replayed, expired, conflict, not_found, error
//	stockctl_reservations_expired_total             reservations this process expired (sweep, late Confirm)
//	stockctl_reservations_expired_units_total       units they gave back
//	stockctl_reservation_expiry_delay_seconds       histogram: deadline → expiry commit (this process's clock)
//	stockctl_commit_batch_orders                    histogram: orders per group-commit transaction
//	stockctl_commit_duration_seconds{outcome}       histogram: one group commit's round trip; outcome
//	                                                committed, refused (a compare failed: diagnosed and
//	                                                answered or retried) or error
//	stockctl_stock_moves_total{kind}                moves this process committed, one per segment filled
//	                                                or emptied: refill (pool → a segment), drain (segment →
//	                                                pool), pull (pool → a segment this process sells from,
//	                                                for an order)
//	stockctl_stock_moved_units_total{kind}          units those moves carried
//	stockctl_stock_move_duration_seconds{kind,outcome}
//	                                                histogram: one move, its locks included; outcome
//	                                                moved, nothing or error
//	stockctl_stock_units{sku,place}                 gauge: units in the pool (place="pool") or a segment
//	                                                (place="0", "1", ...) of each SKU this process touched
//	                                                in the last MetricsSKUIdle, at most MetricsMaxSKUs of
//	                                                them; read from etcd at scrape time (one read per SKU)
//	stockctl_stock_read_errors_total                scrapes that could not read a SKU's stock
//
// The cost is a few atomic adds per order (segments' BenchmarkMetricsPerOrder
// and internal/lock's BenchmarkLockMetricsPerOrder: about 0.5 µs of CPU per
// order together, against about 90 µs per pure allocation on two cores);
// BenchmarkAllocateMetrics runs the hot path with and without.
package coordinator
