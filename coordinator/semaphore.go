package coordinator

import (
	"context"
)

// AcquirePermit blocks until it holds one of the limit permits of the named
// semaphore, or ctx ends: at most limit holders, across all processes, hold
// a semaphore at once. Release the permit with the returned handle's
// Unlock. Semaphore names are their own name space: a semaphore and a lock
// of the same name are unrelated.
//
// A permit has all of a lock's guarantees: it is held under this process's
// lease (a crashed holder's permit comes back after the session TTL); Done
// and Context say when it is lost; IsOwner and Txn fence etcd writes; Token
// is a fencing token per key: larger for every permit than for every
// earlier permit of its key (Key), and than every permit that ended before
// its key was created; a store keeps the highest per key (see Token).
// Processes are served in the order they
// queued in etcd, and each waiter watches one key only. Goroutines of one
// process queue locally, and a released permit is handed to the next of
// them without a round trip within the bounds of WithCohort.
//
// The limit is stored with the semaphore (in every holder's key): asking
// for it with another limit while anyone holds or waits for it fails with
// an error matching both ErrConflict and ErrLimitMismatch (a
// *LimitMismatchError says both limits), and changes nothing. Once nobody
// holds or waits, the next acquirer sets a new limit.
//
// Permits are not reentrant (a second AcquirePermit with a holder's ctx is
// a second permit) and not weighted: each hold is one permit, with its own
// etcd key and token. (A weighted acquire would block every smaller request
// behind a large one to stay fair, could not be handed on locally between
// holds of different weights, and would make every wait step sum values
// instead of counting keys; take n permits for n units if you must, in a
// fixed order.)
//
// ctx bounds the whole wait; when it ends, AcquirePermit returns its cause
// and leaves no trace. Errors: ctx's cause; ErrInvalidArgument (a bad name,
// a limit outside 1 to MaxSemaphoreLimit); the limit mismatch; ErrSessionLost;
// ErrClosed; ErrLocked after TryFor's budget; or the etcd client's error.
func (c *Coordinator) AcquirePermit(ctx context.Context, name string, limit int, opts ...AcquireOption) (*Lock, error) {
	return c.acquire(ctx, "semaphore", name, KindSemaphore, limit, opts)
}
