package coordinator

import (
	"errors"
	"fmt"

	"github.com/stockctl/stockctl/segments"
)

// Lock errors.
var (
	// ErrClosed is returned by every call after Close, and is the cause of
	// locks held when Close was called.
	ErrClosed = errors.New("coordinator: closed")
	// ErrSessionLost means the coordinator's etcd session (its lease) ended
	// while the call waited for a lock: the lease expired, was revoked, or
	// could not be renewed. The next call starts a new session; retrying is
	// safe.
	ErrSessionLost = errors.New("coordinator: etcd session lost")
	// ErrLockLost means a held lock's session ended: another process may
	// hold the lock now, and fenced writes made with it will fail. It is the
	// cause of the lock's Context and the error of Unlock on a lost lock.
	ErrLockLost = errors.New("coordinator: lock lost")
	// ErrNotHeld is returned by Unlock on a handle that was already
	// unlocked. Such an unlock never releases anybody else's hold.
	ErrNotHeld = errors.New("coordinator: lock not held by this handle")
	// ErrLocked is returned by TryLock when the lock stayed held by someone
	// else for the whole wait budget. No key is left behind.
	ErrLocked = errors.New("coordinator: lock is held by someone else")
)

// Stock errors. Each is wrapped with the SKU (and order) it concerns; test
// for them with errors.Is.
var (
	// ErrInvalidArgument: an input was malformed or out of range. Nothing
	// was changed. The error's text names the field.
	ErrInvalidArgument = segments.ErrInvalid
	// ErrInsufficientStock: at one etcd revision the SKU's pool and segments
	// together held less than the quantity asked for. The error is an
	// *InsufficientStockError carrying that revision and what remained.
	ErrInsufficientStock = errors.New("insufficient stock")
	// ErrUnknownSKU: the SKU has not been created.
	ErrUnknownSKU = errors.New("unknown SKU")
	// ErrOrderNotFound: no allocation was made with this order ID.
	ErrOrderNotFound = errors.New("order not found")
	// ErrConflict: the SKU already exists, or the order ID was already used
	// with a different SKU or quantity.
	ErrConflict = errors.New("conflict")
	// ErrCorrupt: a stored value does not decode. Nothing was written. The
	// error is a *segments.CorruptError naming the key.
	ErrCorrupt = segments.ErrCorrupt
)

// InsufficientStockError is the error of an allocation refused for lack of
// stock. The refusal is true at Revision: at that revision the pool and all
// segments together held Remaining < Want.
type InsufficientStockError struct {
	SKU       string
	Want      int64
	Remaining int64
	Revision  int64
}

func (e *InsufficientStockError) Error() string {
	return fmt.Sprintf("%s: %v: want %d, have %d at revision %d", e.SKU, ErrInsufficientStock, e.Want, e.Remaining, e.Revision)
}

// Is makes errors.Is(err, ErrInsufficientStock) true.
func (e *InsufficientStockError) Is(target error) bool { return target == ErrInsufficientStock }
