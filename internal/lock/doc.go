// Package lock is stockctl's lock engine: fenced locks on etcd shared by the
// goroutines of one process.
//
// An Engine owns the process's etcd session (one lease, renewed in the
// background) under which every lock of the process is held, and one Queue
// per lock:
//
//   - engine.go: the session: started on first use, watched, ended (every
//     hold under it lost) when the lease goes.
//   - queue.go: the local FIFO of a lock's goroutines and cohort handoffs;
//     only one goroutine at a time owns the lock's etcd key.
//   - retained.go: retained queues (tenures): the key is kept between holds
//     for the stock layer, which decides when other processes get it.
//   - etcdkey.go: the etcd side, concurrency.Mutex's key protocol with the
//     fixes stockctl needs (synced watches, guarded deletes, waits that end
//     with the session).
//   - hold.go: a goroutine's hold, its ctx, its fence.
//
// Lock order: Engine.mu may be taken before a Queue's mu (the session's end
// walks the queues), never the other way round; a Queue's mu is never held
// across an etcd round trip.
//
// The coordinator package re-exports this package's errors and wraps a Hold
// in its public Lock handle; the segments package keeps segment locks as
// retained queues.
package lock
