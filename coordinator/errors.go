package coordinator

import (
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/stockctl/stockctl/internal/lock"
	"github.com/stockctl/stockctl/segments"
)

// Lock errors.
var (
	// ErrClosed is returned by every call after Close, and is the cause of
	// locks held when Close was called.
	ErrClosed = lock.ErrClosed
	// ErrSessionLost means the coordinator's etcd session (its lease) ended
	// while the call waited for a lock: the lease expired, was revoked, or
	// could not be renewed. The next call starts a new session; retrying is
	// safe.
	ErrSessionLost = lock.ErrSessionLost
	// ErrLockLost means a held lock's session ended: another process may
	// hold the lock now, and fenced writes made with it will fail. It is the
	// cause of the lock's Context and the error of Unlock on a lost lock.
	ErrLockLost = lock.ErrLost
	// ErrNotHeld is returned by Unlock on a handle that was already
	// unlocked. Such an unlock never releases anybody else's hold.
	ErrNotHeld = lock.ErrNotHeld
	// ErrLocked is returned by Lock, RLock or AcquirePermit with TryFor
	// when the lock stayed held by someone else for the whole wait budget.
	// No key is left behind.
	ErrLocked = lock.ErrLocked
	// ErrModeHeld is returned by Lock called with a ctx that carries a
	// shared hold of the same lock, and by RLock with one that carries an
	// exclusive hold: either would wait for its own caller. It also matches
	// ErrInvalidArgument.
	ErrModeHeld = lock.ErrModeHeld
	// ErrLimitMismatch is returned by AcquirePermit asked with a limit other
	// than the one the semaphore's holders and waiters use. It also matches
	// ErrConflict; the error is a *LimitMismatchError. Nothing was written.
	ErrLimitMismatch = lock.ErrLimitMismatch
)

// LimitMismatchError is the error of an AcquirePermit whose limit (Want)
// differs from the semaphore's (Have).
type LimitMismatchError = lock.LimitError

// Stock errors. Each is wrapped with the SKU (and order) it concerns; test
// for them with errors.Is.
var (
	// ErrInvalidArgument: an input was malformed or out of range. Nothing
	// was changed. The error's text names the field.
	ErrInvalidArgument = segments.ErrInvalid
	// ErrInsufficientStock: at one etcd revision the SKU's pool and segments
	// together held less than the quantity asked for. The error is an
	// *InsufficientStockError carrying that revision and what remained.
	ErrInsufficientStock = segments.ErrInsufficientStock
	// ErrUnknownSKU: the SKU has not been created.
	ErrUnknownSKU = segments.ErrUnknownSKU
	// ErrOrderNotFound: no allocation was made with this order ID.
	ErrOrderNotFound = segments.ErrOrderNotFound
	// ErrOrderPruned: the order was applied, then archived by Prune, which
	// keeps its ID for a retention (KeepPrunedIDs, 24 h by default) so that
	// a retry of it is refused instead of applied again; nothing was
	// deducted. It can no longer be released, cancelled or confirmed
	// either. The error is an *OrderPrunedError; it also matches
	// ErrOrderNotFound.
	ErrOrderPruned = segments.ErrOrderPruned
	// ErrConflict: the SKU already exists, or the order ID was already used
	// with a different SKU or quantity; or a semaphore is held with another
	// limit (ErrLimitMismatch).
	ErrConflict = segments.ErrConflict
	// ErrCorrupt: a stored value does not decode. Nothing was written. The
	// error is a *segments.CorruptError naming the key.
	ErrCorrupt = segments.ErrCorrupt
	// ErrExpired: the reservation reached its deadline unconfirmed and its
	// units went back (or go back in the same call): Confirm, Cancel and
	// Release refuse it, and change nothing more. The error is an
	// *ExpiredError.
	ErrExpired = segments.ErrExpired
	// ErrLimitExceeded: the order would take its buyer past the SKU's
	// per-user limit. Nothing was deducted. The error is a
	// *LimitExceededError.
	ErrLimitExceeded = segments.ErrLimitExceeded
	// ErrContention: a write kept failing its compares because the keys it
	// depends on kept moving (other processes writing the same buyer's
	// counter, many releases into one segment at once), for as long as the
	// call's ctx allowed or a few dozen attempts. Nothing was written:
	// retrying under the same order ID is safe. Contention on stockctl's
	// own keys is retried inside first, so this is rare.
	ErrContention = segments.ErrContention
	// ErrNoSpace: etcd's database reached its quota (--quota-backend-bytes;
	// alarm NOSPACE). etcd refuses every write until an operator reclaims
	// space (compact, defragment, disarm the alarm); reads still work. See
	// docs/operations.md. The one write that crossed the quota is applied
	// and still answered with this error (etcd's quota applier does so):
	// as after any error, retry the order under its ID once etcd takes
	// writes again, which replays it if it was applied. It is etcd's own
	// error (rpctypes.ErrNoSpace).
	ErrNoSpace = rpctypes.ErrNoSpace
)

// OrderPrunedError is the error of a retry (or a Release, Cancel or
// Confirm) of an order Prune archived: it names the order and when it was
// pruned.
type OrderPrunedError = segments.OrderPrunedError

// InsufficientStockError is the error of an allocation refused for lack of
// stock: at Revision the pool and all segments together held Remaining <
// Want.
type InsufficientStockError = segments.InsufficientStockError

// ExpiredError is the error of a call on a reservation that expired: it
// carries the deadline and the revision at which it expired.
type ExpiredError = segments.ExpiredError

// LimitExceededError is the error of an order refused by a SKU's per-user
// limit: the buyer held Held units at Revision, and Held + Want > Limit.
type LimitExceededError = segments.LimitExceededError

// SpaceLowError is the error of a new order refused by the space guard
// (WithSpaceGuard): etcd's database is over the guard's share of its
// quota. It matches ErrNoSpace; nothing was written. Prune old orders
// (then reclaim) to make room, and retry under the same order IDs.
type SpaceLowError = segments.SpaceLowError
