package coordinator

import (
	"context"
)

// RLock blocks until it holds the named lock in shared mode (a read lock),
// or ctx ends. Shared holders of a lock hold it together; an exclusive
// holder (Lock) holds it alone. The exclusive and shared modes of a name
// are one read-write lock, served in the order holders queued in etcd: a
// shared request that arrives after an exclusive one is queued waits for
// it, so writers never starve.
//
// Inside one process, goroutines share one etcd key per read burst: an
// RLock joins the process's shared hold without a round trip while no
// exclusive waiter is known to be queued behind it (the coordinator
// watches the locks' keys) and within WithCohort's time bound; otherwise it
// queues in etcd with a key of its own. Every shared hold has its own
// Token.
//
// Reentrancy: with a ctx carrying a shared hold of the same lock, RLock
// re-enters it. With a ctx carrying an exclusive hold of the same lock (or
// Lock with one carrying a shared hold) it fails with ErrModeHeld, since it
// would wait for itself: there is no upgrade or downgrade in place.
//
// ctx bounds the whole wait; when it ends, RLock returns its cause and
// leaves no trace. Errors are Lock's, and ErrModeHeld.
func (c *Coordinator) RLock(ctx context.Context, name string, opts ...AcquireOption) (*Lock, error) {
	return c.acquire(ctx, "rlock", name, KindShared, 0, opts)
}
