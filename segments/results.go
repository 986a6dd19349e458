package segments

import (
	"context"
	"slices"
	"time"
)

// Allocation is the outcome of an allocation: how much of a SKU an order
// took, and from where.
type Allocation struct {
	SKU   string
	Order string
	Qty   int64
	// Parts says where the stock came from; the quantities add up to Qty.
	Parts []Part
	// Revision is the etcd revision at which the allocation was committed.
	Revision int64
	// Replayed is true when the order ID had already been applied before
	// this call: nothing was deducted now, and the fields describe the first
	// application.
	Replayed bool
	// Released is true when the order has since been released (only
	// possible on a replay).
	Released bool
	// State is "" for a plain allocation; for a reservation (Reserve) it is
	// StateReserved when made, and on a replay whatever the reservation has
	// become since (confirmed, expired).
	State OrderState
	// Deadline is when a reservation expires unless confirmed (zero for a
	// plain allocation).
	Deadline time.Time
	// Buyer is the buyer the order was placed for (WithBuyer), if any.
	Buyer string
}

// OrderOption adds to an order what not every caller needs.
type OrderOption func(*orderOpts)

type orderOpts struct {
	buyer  string
	across []string
}

// WithAcross records, on every record of an order of several lines, the
// SKUs of the whole order it is a part of (Order.Across): a coordinator
// over several clusters places each cluster's lines as one order of its
// own under the same ID, and finds the other clusters' parts through it.
// Only AllocateOrder and ReserveOrder use it.
func WithAcross(skus []string) OrderOption {
	s := slices.Clone(skus)
	slices.Sort(s)
	return func(o *orderOpts) { o.across = s }
}

// WithBuyer names the buyer an order is for. On a SKU with a per-user limit
// (SKUConfig.PerUserLimit) it is required, and the order is refused with
// ErrLimitExceeded when the buyer's units (confirmed and live reserved
// orders) would exceed the limit: the check and the deduction commit in one
// transaction. Elsewhere it is only recorded on the order. A buyer ID is 1
// to MaxBuyerLen bytes of printable ASCII other than space and '/'. A retry
// of the order must name the same buyer. With AllocateFunc the limit is
// judged at the commit, after the step ran: a refused order's step must be
// undone like any step whose order failed.
func WithBuyer(buyer string) OrderOption {
	return func(o *orderOpts) { o.buyer = buyer }
}

// Step is a business step run by AllocateFunc while the stock it will take
// is locked: check the stock, create the order, charge the card... Its ctx
// is cancelled if a lock is lost meanwhile. Returning an error cancels the
// allocation: nothing is deducted and AllocateFunc returns the error.
type Step func(ctx context.Context) error

// Released is the outcome of a release or a cancel.
type Released struct {
	SKU   string
	Order string
	Qty   int64
	Parts []Part
	// Released is false when the order had already been released: nothing
	// was returned by this call.
	Released bool
	// Revision is the revision of the release (of the earlier one when
	// Released is false).
	Revision int64
	// State is the order's reservation state ("" for a plain allocation);
	// StateExpired when the units went back by expiry.
	State OrderState
	// Buyer is the buyer the order was placed for, if any.
	Buyer string
}

// Confirmed is the outcome of a Confirm.
type Confirmed struct {
	SKU   string
	Order string
	Qty   int64
	Parts []Part
	Buyer string
	// Deadline is the deadline the reservation had.
	Deadline time.Time
	// Revision is the revision of the confirmation (of the first one when
	// Replayed).
	Revision int64
	// Replayed is true when the reservation had been confirmed before this
	// call: nothing changed now.
	Replayed bool
}

// Expiry is one reservation expired by ExpireDue.
type Expiry struct {
	SKU      string
	Order    string
	Qty      int64
	Buyer    string
	Deadline time.Time
	// Revision is the revision that expired it.
	Revision int64
	// At is when this process saw the expiry committed; At − Deadline is
	// the sweep's delay (by this process's clock).
	At time.Time
}

// Restocked is the outcome of a restock.
type Restocked struct {
	SKU      string
	Delivery string // the delivery ID
	Qty      int64  // the units the delivery added
	Total    int64  // the SKU's total right after the restock
	Pool     int64  // the pool right after the restock
	// Revision is the etcd revision at which the restock was committed.
	Revision int64
	// Replayed is true when the delivery ID had already been applied
	// before this call: nothing was added now, and the fields describe the
	// first application (Total and Pool as they were right after it).
	Replayed bool
}
