package coordinator

import (
	"context"
	"fmt"
	"time"

	"github.com/stockctl/stockctl/segments"
)

// Orders of several lines: a cart (a phone and its case), or a warehouse's
// outbound order, deducted all or nothing under one order ID.

// Line is one line of an order of several lines: Qty units of SKU. An
// order names each SKU at most once.
type Line = segments.Line

// MaxOrderLines is the most lines one order may have; the etcd server's
// --max-txn-ops (WithMaxTxnOps) may allow fewer (see segments.MaxOrderLines:
// with the default 128, about 32 lines of one place each).
const MaxOrderLines = segments.MaxOrderLines

// OrderAllocation is the outcome of AllocateOrder and ReserveOrder: one
// Allocation per line, in the order the lines were given, and the one
// revision at which they all committed.
type OrderAllocation = segments.OrderAllocation

// OrderReleased is the outcome of ReleaseOrder and CancelOrder: one
// Released per line, by SKU name.
type OrderReleased = segments.OrderReleased

// OrderConfirmed is the outcome of ConfirmOrder: one Confirmed per line,
// by SKU name.
type OrderConfirmed = segments.OrderConfirmed

// LineError is the error of an order of several lines refused for one of
// its lines: Index (from 0, in the order given) and SKU name the line, Err
// is the *InsufficientStockError or *LimitExceededError of that line.
// errors.Is(err, ErrInsufficientStock) and errors.As work through it.
type LineError = segments.LineError

// AllocateOrder takes every line of an order, or none: each line's units
// of its SKU, all in one etcd transaction that also writes one order
// record per line (at the line's SKU, under orderID). No caller, process
// or crash can see or leave a part of the order applied.
//
// A line is served from its SKU's pool and the segments no process holds
// a lock on (a transaction that compares each place's counter and that its
// lock has no key, as a plain order without a held segment does); when
// the stock sits in segments other processes hold, the order locks the
// places it needs in the global order (SKU name, then the pool, then
// segments by index), waiting for each at most the fallback wait
// (WithWaitBudgets), and commits fenced by every lock. Lazy segments
// (the default, WithLazySegments) are only used through their locks. The
// orders of several lines this process places at one moment are read together and
// committed in one transaction when they can be (each still all or
// nothing: a cart that cannot join goes on alone).
//
// The order is refused, nothing deducted, with an error wrapping a
// *LineError that names the first line (in the order given) that could not
// be served: its *InsufficientStockError says that at that revision (read
// after the call began, one revision for every line) its SKU's pool and
// segments together held less than the line's quantity; a
// *LimitExceededError says the buyer's limit of that SKU (WithBuyer is
// then required) would be passed. An order is never refused while every
// line could be served at the revision it reports.
//
// Idempotent by orderID: a retry with the same lines (in any order) and
// buyer returns the first outcome whole, with Replayed set, deducting
// nothing; the same ID with other SKUs, quantities or buyer, or already
// used by a single-SKU order of one of the SKUs, is ErrConflict. After a
// timeout or a lost reply, retrying with the same order ID tells the true
// outcome. ctx bounds the call; when it ends after the transaction was
// sent, the order may have been applied (retry to learn it).
//
// Lines are 1 to MaxOrderLines, each SKU at most once, each quantity
// 1 to segments.MaxQty; an order too large for one transaction under the
// server's --max-txn-ops is ErrInvalidArgument. Release, cancel, confirm and
// expiry act on the whole order: ReleaseOrder and the others, and also
// Release, Cancel and Confirm called with any one line's SKU.
//
// Over several clusters (NewClusters), an order whose lines are all in one
// cluster is one transaction there, as above. An order over several
// clusters cannot be (one transaction never spans two): each cluster's
// lines are reserved as one order of that cluster (same order ID, a TTL of
// WithAcrossTTL, DefaultAcrossTTL by default), cluster by cluster in the
// order of their names, then confirmed the same way. A refusal in one
// cluster cancels what the others reserved and names the line by its index
// in lines. Before the confirms, a commit decision is written in the
// cluster of the order's first SKU by name: every cluster's rebalancer
// confirms, rather than expires, the lines of a committed order, and
// expires those of one it finds undecided (aborting it), so no crash
// leaves a part of the order confirmed and the rest given back. A process
// that dies before the decision leaves the units reserved until the TTL,
// when they expire; a retry with the same order ID goes on where the first
// call stopped (it confirms what is reserved; if the order was aborted, a
// cluster's reservation expired meanwhile, it gives every line back and
// answers ErrExpired: place the order again under a new ID). The outcome's
// lines are confirmed reservations (State StateConfirmed), each at its
// cluster's revision; the order's Revision is 0. docs/clusters.md
// describes the protocol.
func (c *Coordinator) AllocateOrder(ctx context.Context, orderID string, lines []Line, opts ...OrderOption) (*OrderAllocation, error) {
	if a, err, across := c.acrossOnce(ctx, lines, func(groups []*orderGroup) (*OrderAllocation, error) {
		return c.allocateAcross(ctx, "allocate", orderID, lines, groups, c.fleet.acrossTTL, true, opts)
	}); across {
		return a, err
	}
	return onLines(ctx, c, lines, func(e *segments.Engine) (*OrderAllocation, error) {
		return e.AllocateOrder(ctx, orderID, lines, opts...)
	})
}

// ReserveOrder is AllocateOrder as a reservation: every line holds its
// units until ConfirmOrder, or until ttl after the commit, when the elected
// rebalancer's sweep expires every line together (one transaction). The
// lines share one deadline. ttl is Reserve's: more than 0, at most
// segments.MaxReservationTTL. A retry returns the first outcome (and the
// first deadline); the same ID used for a plain AllocateOrder is
// ErrConflict.
//
// Over several clusters, an order whose lines are in several is reserved
// cluster by cluster (each cluster's lines all or none, the caller's ttl
// each; a refusal cancels the others): ConfirmOrder, ReleaseOrder and
// CancelOrder then act on every cluster's lines. Each cluster's lines have
// their own deadline and revision (the order's Revision is 0) and expire
// by their own cluster's sweep.
func (c *Coordinator) ReserveOrder(ctx context.Context, orderID string, lines []Line, ttl time.Duration, opts ...OrderOption) (*OrderAllocation, error) {
	if a, err, across := c.acrossOnce(ctx, lines, func(groups []*orderGroup) (*OrderAllocation, error) {
		if err := segments.ValidateTTL(ttl); err != nil {
			return nil, fmt.Errorf("reserve order %q: %w", orderID, err)
		}
		return c.allocateAcross(ctx, "reserve", orderID, lines, groups, ttl, false, opts)
	}); across {
		return a, err
	}
	return onLines(ctx, c, lines, func(e *segments.Engine) (*OrderAllocation, error) {
		return e.ReserveOrder(ctx, orderID, lines, ttl, opts...)
	})
}

// ReleaseOrder gives back every line of an order in one transaction and
// marks every line released (Release's rules: any active order, a live
// reservation or a confirmed one; *ExpiredError for an expired one). sku is
// any one SKU of the order: its record lists the others. Releasing again
// reports Released false. An order of one SKU (Allocate) is released as
// Release does, as an order of one line.
//
// Over several clusters, an order whose lines are in several is released in
// each cluster (one transaction per cluster), whichever line's SKU is given.
func (c *Coordinator) ReleaseOrder(ctx context.Context, sku, orderID string) (*OrderReleased, error) {
	if groups, err := c.acrossOf(ctx, sku, orderID); err != nil || groups != nil {
		if err != nil {
			return nil, err
		}
		return c.returnAcross(ctx, orderID, groups, false)
	}
	return onSKU(ctx, c, sku, func(e *segments.Engine) (*OrderReleased, error) { return e.ReleaseOrder(ctx, sku, orderID) })
}

// CancelOrder gives back every line of a live reserved order (ReserveOrder)
// in one transaction (Cancel's rules: ErrConflict for a confirmed or plain
// order, *ExpiredError for an expired one). sku is any SKU of the order.
// Over several clusters it aborts the order (ErrConflict once it is
// committed: its lines are being confirmed) and cancels every cluster's
// lines.
func (c *Coordinator) CancelOrder(ctx context.Context, sku, orderID string) (*OrderReleased, error) {
	if groups, err := c.acrossOf(ctx, sku, orderID); err != nil || groups != nil {
		if err != nil {
			return nil, err
		}
		return c.returnAcross(ctx, orderID, groups, true)
	}
	return onSKU(ctx, c, sku, func(e *segments.Engine) (*OrderReleased, error) { return e.CancelOrder(ctx, sku, orderID) })
}

// ConfirmOrder makes every line of a live reserved order final, in one
// transaction (Confirm's rules: idempotent, with Replayed on a repeat;
// *ExpiredError when the order expired, including when this call finds it
// past its deadline and expires every line itself). sku is any SKU of the
// order.
// Over several clusters it confirms every cluster's lines, cluster by
// cluster; if one cluster's lines expired, every cluster's lines are given
// back and the error matches ErrExpired.
func (c *Coordinator) ConfirmOrder(ctx context.Context, sku, orderID string) (*OrderConfirmed, error) {
	if groups, err := c.acrossOf(ctx, sku, orderID); err != nil || groups != nil {
		if err != nil {
			return nil, err
		}
		return c.confirmAcross(ctx, orderID, groups)
	}
	return onSKU(ctx, c, sku, func(e *segments.Engine) (*OrderConfirmed, error) { return e.ConfirmOrder(ctx, sku, orderID) })
}
