package segments

import (
	"errors"
	"fmt"
	"time"
)

// Stock errors. Each is wrapped with the SKU (and order) it concerns; test
// for them with errors.Is. The coordinator package re-exports them.
var (
	// ErrInsufficientStock: at one etcd revision the SKU's pool and segments
	// together held less than the quantity asked for. The error is an
	// *InsufficientStockError carrying that revision and what remained.
	ErrInsufficientStock = errors.New("insufficient stock")
	// ErrUnknownSKU: the SKU has not been created.
	ErrUnknownSKU = errors.New("unknown SKU")
	// ErrOrderNotFound: no allocation was made with this order ID.
	ErrOrderNotFound = errors.New("order not found")
	// ErrOrderPruned: the order was applied, then archived by Prune, which
	// keeps its ID for a retention (24 h by default, see KeepPrunedIDs) so
	// that a retry of it is refused instead of applied a second time. It
	// can no longer be released, cancelled or confirmed either. The error
	// is an *OrderPrunedError; it also matches ErrOrderNotFound (the
	// order's record is gone).
	ErrOrderPruned = errors.New("order pruned")
	// ErrConflict: the SKU already exists, or the order ID was already used
	// with a different SKU or quantity.
	ErrConflict = errors.New("conflict")
	// ErrExpired: the reservation reached its deadline unconfirmed and its
	// units went back (or go back in the same call). The error is an
	// *ExpiredError.
	ErrExpired = errors.New("reservation expired")
	// ErrLimitExceeded: the order would take its buyer past the SKU's
	// per-user limit. Nothing was deducted. The error is a
	// *LimitExceededError.
	ErrLimitExceeded = errors.New("per-user limit exceeded")
	// ErrFenced is returned by a move whose caller-supplied fence compare
	// failed: for the rebalancer, it lost its leadership. Nothing was moved.
	ErrFenced = errors.New("coordinator: fence compare failed")
)

// ErrContention: a write kept failing its compares because the keys it
// reads moved under it (for a return, releases and refills of the same
// inbox; for an order, a buyer's counter written by other processes, or
// stock that changed under the lock after the business step), for as long
// as the caller's ctx allowed or maxCommitAttempts times. Nothing was
// written; a retry under the same order ID is safe. It is rare: contention
// on stockctl's own keys is retried inside first.
var ErrContention = errors.New("coordinator: commit kept failing its compares; retry")

// errContention is ErrContention, for the code that predates its export.
var errContention = ErrContention

// maxCommitAttempts bounds how often one commit is retried after a compare
// failed for a reason that calls for re-reading, when the caller's ctx has
// no deadline sooner.
const maxCommitAttempts = 64

// The error types below leave the SKU and the order out of their messages:
// the operation that returns one names them ("confirm tee order "o-1":
// reservation expired at ..."), and a message says each thing once. Their
// fields carry them for programs.

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
	return fmt.Sprintf("%v at %s (revision %d)", ErrExpired, e.Deadline.Format(time.RFC3339Nano), e.Revision)
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
	if e.Want > e.Limit && e.Held == 0 {
		return fmt.Sprintf("buyer %q: %v: wants %d, more than the limit %d by itself", e.Buyer, ErrLimitExceeded, e.Want, e.Limit)
	}
	return fmt.Sprintf("buyer %q: %v: holds %d, wants %d more, limit %d (revision %d)",
		e.Buyer, ErrLimitExceeded, e.Held, e.Want, e.Limit, e.Revision)
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
	return fmt.Sprintf("%v: want %d, have %d at revision %d", ErrInsufficientStock, e.Want, e.Remaining, e.Revision)
}

// Is makes errors.Is(err, ErrInsufficientStock) true.
func (e *InsufficientStockError) Is(target error) bool { return target == ErrInsufficientStock }

// OrderPrunedError is ErrOrderPruned with the order and when Prune
// archived it (by the pruning process's clock).
type OrderPrunedError struct {
	SKU, Order string
	Pruned     time.Time
}

func (e *OrderPrunedError) Error() string {
	return fmt.Sprintf("%v: order %q of SKU %q was archived by prune at %s; it was applied before, so a retry of it is refused "+
		"(and it can no longer be released, cancelled or confirmed)", ErrOrderPruned, e.Order, e.SKU, e.Pruned.Format(time.RFC3339))
}

// Is makes errors.Is(err, ErrOrderPruned) and errors.Is(err,
// ErrOrderNotFound) true.
func (e *OrderPrunedError) Is(target error) bool {
	return target == ErrOrderPruned || target == ErrOrderNotFound
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
