package coordinator

import (
	"errors"
	"fmt"
	"time"

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
	// ErrExpired: the reservation reached its deadline unconfirmed and its
	// units went back (or go back in the same call): Confirm, Cancel and
	// Release refuse it, and change nothing more. The error is an
	// *ExpiredError.
	ErrExpired = errors.New("reservation expired")
	// ErrLimitExceeded: the order would take its buyer past the SKU's
	// per-user limit. Nothing was deducted. The error is a
	// *LimitExceededError.
	ErrLimitExceeded = errors.New("per-user limit exceeded")
)

// ExpiredError is the error of a call on a reservation that expired.
type ExpiredError struct {
	SKU      string
	Order    string
	Deadline time.Time
	// Revision is the revision at which the reservation expired (0 if not
	// known).
	Revision int64
}

func (e *ExpiredError) Error() string {
	return fmt.Sprintf("%s order %q: %v at %s (revision %d)", e.SKU, e.Order, ErrExpired, e.Deadline.Format(time.RFC3339Nano), e.Revision)
}

// Is makes errors.Is(err, ErrExpired) true.
func (e *ExpiredError) Is(target error) bool { return target == ErrExpired }

// LimitExceededError is the error of an order refused by a SKU's per-user
// limit: the buyer held Held units at Revision (0 when the order alone is
// over the limit and nothing was read), and Held + Want > Limit.
type LimitExceededError struct {
	SKU      string
	Buyer    string
	Limit    int64
	Held     int64
	Want     int64
	Revision int64
}

func (e *LimitExceededError) Error() string {
	return fmt.Sprintf("%s buyer %q: %v: holds %d, wants %d more, limit %d (revision %d)",
		e.SKU, e.Buyer, ErrLimitExceeded, e.Held, e.Want, e.Limit, e.Revision)
}

// Is makes errors.Is(err, ErrLimitExceeded) true.
func (e *LimitExceededError) Is(target error) bool { return target == ErrLimitExceeded }

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
