// Package rebalance moves stock between a SKU's central pool and its
// segments, so that segments serving traffic keep stock and stock is not
// stranded at the end of a sale.
//
// Any number of processes may run a Rebalancer; exactly one acts at a time,
// elected through etcd (concurrency.Election on the coordinator's session).
// Every move is one etcd transaction fenced by the place locks it touches
// (the same locks allocations take) and by the leader's election key, so a
// deposed or paused leader can never move stock. When the leader's process
// dies, another takes over within the session TTL.
//
// # Policy
//
// Refill. A segment needs stock when what it can give (its counter plus its
// inbox) is below the SKU's low watermark, or is zero when the watermark is
// zero. The leader then moves min(refill batch, pool) into it. It waits at
// most a second for the SKU's pool lock (a process paused while holding it
// keeps it until its lease ends) and tries that SKU again in its next round,
// so one such SKU does not hold up the others' refills. It learns of
// such crossings from a watch on the stock counters and reacts at once; a
// periodic sweep (SweepInterval) re-reads everything, as a safety net for
// missed events and for a new leader.
//
// Consolidation (the end of a sale). When a SKU's pool is empty and one of
// its segments is empty, every segment that still holds stock but has not
// changed for IdleAfter is drained back into the pool, from where every
// request can take it (the pool is every request's first fallback) and
// from where it is refilled, in small batches, into segments that run dry
// under traffic. A drained segment is parked, and so is an idle one that is
// dry: it is not refilled again until the SKU is restocked or its counters
// change by others (a sale there, stock returned to it), so stock does not
// bounce to where nobody buys. A new leader knows no parked segments: it may
// refill a dry segment once, and drain it once IdleAfter later.
//
// Changes to the SKU list, restocks and watermarks are read from watches on
// the meta records; nothing needs a restart.
package rebalance
