// Package lock is stockctl's lock engine: fenced locks on etcd shared by the
// goroutines of one process.
//
// An Engine owns the process's etcd session (one lease, renewed in the
// background) under which every lock of the process is held, and one queue
// per lock:
//
//   - engine.go: the queues' registry and what the engine asks of a queue.
//   - session.go: the session: started on first use, its renewals watched,
//     ended (every hold under it lost) when the lease goes.
//   - queue.go: an exclusive lock's local FIFO and cohort handoffs; only one
//     goroutine at a time owns the lock's etcd key.
//   - acquisition.go: the wait in etcd for an exclusive key, which outlives
//     a goroutine that gives up while others of the process wait, so that
//     the process keeps its place in etcd's queue.
//   - retained.go: retained queues (tenures): the key is kept between holds
//     for the stock layer, which decides when other processes get it.
//   - shared.go: the shared (read) side of a read-write lock: goroutines
//     join the process's open shared key, writers close it.
//   - semaphore.go: a semaphore's permits and local FIFO.
//   - named.go: named acquisitions of every mode (Spec, AcquireNamed).
//   - etcdkey.go: the etcd side of exclusive and shared keys,
//     concurrency.Mutex's key protocol with the fixes stockctl needs (synced
//     watches, waits that end with the session); etcdsem.go: a semaphore's;
//     etcddelete.go: guarded deletes.
//   - delay.go: lock-delay records.
//   - keywatch.go: one watch per process over the named locks' keys: a
//     deleted key ends its holds, a queued writer closes shared keys.
//   - list.go: holders and waiters as etcd shows them.
//   - hold.go: a goroutine's hold, its ctx, its token, its fence.
//
// Lock order: Engine.mu may be taken before a queue's mu (the session's end
// walks the queues), never the other way round; a queue's mu is never held
// across an etcd round trip.
//
// The coordinator package re-exports this package's errors and wraps a Hold
// in its public Lock handle; the segments package keeps segment locks as
// retained queues.
package lock
