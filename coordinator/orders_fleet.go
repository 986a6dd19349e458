package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stockctl/stockctl/segments"
)

// Orders of several lines whose SKUs are in several etcd clusters
// (NewClusters). One transaction cannot span two Raft groups, so such an
// order is placed in two phases, each cluster's lines (its group) being an
// order of several lines of its own in that cluster, under the same order
// ID, its records listing the whole order's SKUs (Order.Across):
//
//  1. every group is reserved (ReserveOrder, all or nothing in its
//     cluster), in the order of the clusters' names; a group refused
//     cancels the groups already reserved, and the refusal names the line
//     by its index in the caller's order;
//  2. AllocateOrder then writes the order's commit decision (decision.go)
//     and confirms every group, all at once.
//
// Between the reserves and the decision the units are held as
// reservations: a process that dies there leaves them held until the
// reservations' TTL (WithAcrossTTL, DefaultAcrossTTL), when each cluster's
// rebalancer expires them (aborting the order). One that dies after the
// decision leaves an order that each cluster's rebalancer confirms instead.
// A retry with the same order ID finds every group's records and goes on
// from where the first call stopped. docs/clusters.md describes the
// protocol.

// DefaultAcrossTTL is how long AllocateOrder over several clusters holds
// each cluster's lines as a reservation, at most, before it confirms them
// (WithAcrossTTL).
const DefaultAcrossTTL = 30 * time.Second

// undoTimeout bounds the cancels that undo a cross-cluster order when the
// caller's ctx has ended.
const undoTimeout = 5 * time.Second

// acrossHook, when set (tests), runs after every group of a cross-cluster
// AllocateOrder is reserved and before any is confirmed; an error stops the
// call there, as if its process died.
var acrossHook func(orderID string) error

// acrossStepHook, when set (tests), runs at the steps of a cross-cluster
// confirm: "decided" (the commit decision written, no confirm sent yet) and
// "confirm <cluster>" (before that cluster's confirm is sent). An error
// stops the call there (at "confirm", that cluster's confirm is not sent,
// the others are), as if its process died.
var acrossStepHook func(orderID, step string) error

// orderGroup is one cluster's lines of an order.
type orderGroup struct {
	m     *member
	lines []Line
	idx   []int // each line's index in the caller's order
}

// acrossGroups groups lines by cluster, in the order of the clusters'
// names, when they are in more than one cluster of a fleet; nil otherwise
// (and for lines that are not valid: the one-cluster path answers them).
func (c *Coordinator) acrossGroups(ctx context.Context, lines []Line) ([]*orderGroup, error) {
	if c.fleet == nil || len(lines) < 2 || segments.ValidateLines(lines) != nil {
		return nil, nil
	}
	by := map[*member]*orderGroup{}
	var groups []*orderGroup
	for i, l := range lines {
		m, _, err := c.fleet.route(ctx, l.SKU)
		if err != nil {
			return nil, err
		}
		g := by[m]
		if g == nil {
			g = &orderGroup{m: m}
			by[m] = g
			groups = append(groups, g)
		}
		g.lines = append(g.lines, l)
		g.idx = append(g.idx, i)
	}
	if len(groups) < 2 {
		return nil, nil
	}
	slices.SortFunc(groups, func(a, b *orderGroup) int { return strings.Compare(a.m.name, b.m.name) })
	return groups, nil
}

// acrossOnce runs place on lines that are in several clusters, and
// reports across false (doing nothing) when they are not. Placements may
// come from the cache: a SKU moved since (deleted, created in another
// cluster) answers ErrUnknownSKU in the cluster it was cached in, before
// anything of this call is held there (allocateAcross gives back what it
// reserved on any error), so the lines are looked up afresh and placed
// again, once; they may then be in one cluster (the one-cluster path).
func (c *Coordinator) acrossOnce(ctx context.Context, lines []Line, place func([]*orderGroup) (*OrderAllocation, error)) (a *OrderAllocation, err error, across bool) {
	type placed struct {
		a      *OrderAllocation
		across bool
	}
	p, err := freshOnce(c.fleet, lines, func(bool) (placed, bool, error) {
		groups, err := c.acrossGroups(ctx, lines)
		if err != nil {
			return placed{across: true}, false, err
		}
		if groups == nil {
			return placed{}, false, nil
		}
		a, err := place(groups)
		return placed{a: a, across: true}, errors.Is(err, ErrUnknownSKU), err
	})
	return p.a, err, p.across
}

// groupsOf groups an order's SKUs (a record's Across) by cluster, in the
// order of the clusters' names; each group's lines carry no quantity.
func (c *Coordinator) groupsOf(ctx context.Context, skus []string) ([]*orderGroup, error) {
	lines := make([]Line, len(skus))
	for i, s := range skus {
		lines[i] = Line{SKU: s, Qty: 1}
	}
	return c.acrossGroups(ctx, lines)
}

// allocateAcross places an order whose lines are in several clusters:
// every group reserved, then, when confirm, every group confirmed.
func (c *Coordinator) allocateAcross(ctx context.Context, verb, orderID string, lines []Line, groups []*orderGroup,
	ttl time.Duration, confirm bool, opts []OrderOption) (*OrderAllocation, error) {
	all := make([]string, len(lines))
	for i, l := range lines {
		all[i] = l.SKU
	}
	opts = append(slices.Clone(opts), segments.WithAcross(all))
	out := &OrderAllocation{Order: orderID, Lines: make([]*Allocation, len(lines)), Replayed: true}
	var dead *orderGroup // a group whose earlier reservation is no longer active
	var deadA *Allocation
	// fresh: the groups this call reserved; pending: those an earlier call
	// reserved and did not confirm.
	var fresh, pending []*orderGroup
	for _, g := range groups {
		err := g.m.connected(ctx)
		var a *OrderAllocation
		if err == nil {
			a, err = g.m.c.stock.ReserveOrder(ctx, orderID, g.lines, ttl, opts...)
		}
		if err != nil {
			// What this call reserved goes back; on a refusal, also what an
			// earlier call reserved and never confirmed (the order was never
			// whole). Not on another error (ErrConflict: another order's
			// reservations under this ID are not this call's to cancel; a
			// lost reply: the caller retries to learn the outcome). What
			// cannot be cancelled expires at its deadline.
			le, refused := errors.AsType[*LineError](err)
			if refused {
				c.undoAcross(ctx, orderID, append(fresh, pending...))
				err = fmt.Errorf("%s order %q: %w", verb, orderID,
					&LineError{Index: g.idx[le.Index], SKU: le.SKU, Qty: le.Qty, Err: le.Err})
			} else {
				c.undoAcross(ctx, orderID, fresh)
			}
			return nil, g.m.wrap(err)
		}
		switch {
		case !a.Replayed:
			fresh = append(fresh, g)
		case a.State == segments.StateReserved && !a.Released:
			pending = append(pending, g)
		}
		for j, la := range a.Lines {
			out.Lines[g.idx[j]] = la
		}
		out.Replayed = out.Replayed && a.Replayed
		out.Released = out.Released || a.Released
		out.State, out.Deadline, out.Buyer = a.State, a.Deadline, a.Buyer
		if a.Replayed && (a.Released || a.State == segments.StateExpired) && dead == nil {
			dead, deadA = g, a.Lines[0]
		}
	}
	if dead != nil {
		// An earlier call's reservation in one cluster is over (expired, or
		// released): the order can no longer be whole. What the others hold
		// goes back.
		if n := c.undoAcross(ctx, orderID, groups); n == 0 && (!confirm || deadA.State != segments.StateExpired) {
			return out, nil // every group was over already: the first outcome
		}
		how := "released"
		var sentinel error = ErrConflict
		if deadA.State == segments.StateExpired {
			how, sentinel = "expired", &ExpiredError{SKU: deadA.SKU, Order: orderID, Deadline: deadA.Deadline}
		}
		return nil, fmt.Errorf("%s order %q: %w: its lines in cluster %q were %s before the order was whole "+
			"(a call stopped between the reserves and the confirms); every cluster's lines are given back: "+
			"place the order again under a new order ID", verb, orderID, sentinel, dead.m.name, how)
	}
	if !confirm {
		return out, nil
	}
	if acrossHook != nil {
		if err := acrossHook(orderID); err != nil {
			return nil, err
		}
	}
	if _, err := c.confirmAcross(ctx, orderID, groups); err != nil {
		return nil, fmt.Errorf("%s order %q: %w", verb, orderID, err)
	}
	out.State, out.Deadline, out.Revision = segments.StateConfirmed, time.Time{}, 0
	for _, la := range out.Lines {
		la.State, la.Deadline = segments.StateConfirmed, time.Time{}
	}
	return out, nil
}

// confirmAcross commits the order (its decision, decision.go) and then
// confirms every group, all at once. Once the decision is written, every
// group ends confirmed: by these confirms, by a retry's, or by its
// cluster's expiry sweep, which confirms instead of expiring the lines of a
// committed order, so a process that dies between the decision and the
// last confirm leaves no partial order. A decision found aborted (a sweep
// expired a group first) gives every group back (ErrExpired); another
// error is returned as it is, naming its cluster: a retry with the order
// ID goes on. Once every group is confirmed the decision is deleted.
func (c *Coordinator) confirmAcross(ctx context.Context, orderID string, groups []*orderGroup) (*OrderConfirmed, error) {
	across := acrossSKUs(groups)
	decided, err := c.fleet.commitDecision(ctx, orderID, across)
	if err != nil {
		if errors.Is(err, errAborted) {
			c.undoAcross(ctx, orderID, groups)
			return nil, fmt.Errorf("%w; every cluster's lines are given back", err)
		}
		return nil, err
	}
	if acrossStepHook != nil {
		if err := acrossStepHook(orderID, "decided"); err != nil {
			return nil, err
		}
	}
	cfs := make([]*OrderConfirmed, len(groups))
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Go(func() {
			if acrossStepHook != nil {
				if errs[i] = acrossStepHook(orderID, "confirm "+g.m.name); errs[i] != nil {
					return
				}
			}
			err := g.m.connected(ctx)
			if err == nil {
				cfs[i], err = g.m.c.stock.ConfirmOrder(ctx, g.lines[0].SKU, orderID)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil && errors.Is(err, ErrExpired) {
			// Not under a committed decision (its sweep confirms instead):
			// a record expired without one (a one-cluster process's sweep).
			c.undoAcross(ctx, orderID, groups)
			return nil, groups[i].m.wrap(fmt.Errorf("%w: its lines in this cluster expired before they were confirmed; "+
				"every cluster's lines are given back", err))
		}
	}
	out := &OrderConfirmed{Order: orderID, Replayed: true}
	for i, err := range errs {
		if err != nil {
			return nil, groups[i].m.wrap(fmt.Errorf("%w (retry with the same order ID: it confirms the rest, or gives every line back "+
				"if a cluster's reservation expired meanwhile)", err))
		}
		out.Lines = append(out.Lines, cfs[i].Lines...)
		out.Replayed = out.Replayed && cfs[i].Replayed
		out.Revision = max(out.Revision, cfs[i].Revision)
	}
	slices.SortFunc(out.Lines, func(a, b *segments.Confirmed) int { return strings.Compare(a.SKU, b.SKU) })
	if decided {
		c.fleet.forgetDecision(ctx, orderID, across)
	}
	return out, nil
}

// acrossSKUs is the SKUs of every group's lines, sorted: the order's
// Across.
func acrossSKUs(groups []*orderGroup) []string {
	var skus []string
	for _, g := range groups {
		for _, l := range g.lines {
			skus = append(skus, l.SKU)
		}
	}
	slices.Sort(skus)
	return skus
}

// undoAcross gives back every group of the order that still holds units:
// cancelled while reserved, released once confirmed. Errors are dropped:
// a reservation that could not be cancelled expires at its deadline. It
// reports how many groups gave units back.
func (c *Coordinator) undoAcross(ctx context.Context, orderID string, groups []*orderGroup) int {
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
		defer cancel()
	}
	// Aborted first, so that no other call (a retry under the same ID)
	// commits while the groups are given back one after the other. Best
	// effort: giving back the decision's own group aborts it too.
	_, _ = c.fleet.abortDecision(ctx, orderID, acrossSKUs(groups))
	n := 0
	for _, g := range groups {
		if g.m.connected(ctx) != nil {
			continue
		}
		r, err := g.m.c.stock.CancelOrder(ctx, g.lines[0].SKU, orderID)
		if errors.Is(err, ErrConflict) { // confirmed
			r, err = g.m.c.stock.ReleaseOrder(ctx, g.lines[0].SKU, orderID)
		}
		if err == nil && r.Released {
			n++
		}
	}
	return n
}

// acrossOf reads the record of orderID at sku and, when it is a part of an
// order over several clusters, returns its groups (nil otherwise).
func (c *Coordinator) acrossOf(ctx context.Context, sku, orderID string) ([]*orderGroup, error) {
	if c.fleet == nil {
		return nil, nil
	}
	o, err := routeSKU(ctx, c.fleet, sku, func(e *segments.Engine) (segments.Order, error) { return e.OrderRecord(ctx, sku, orderID) })
	if err != nil && (errors.Is(err, ErrClusterUnavailable) || ctx.Err() != nil) {
		return nil, err // the operation would fail the same way: not twice as long
	}
	if err != nil || len(o.Across) == 0 {
		return nil, nil // the one-cluster path answers (and reports the error)
	}
	return c.groupsOf(ctx, o.Across)
}

// returnAcross releases or cancels every group of an order over several
// clusters, each in one transaction of its cluster. It goes on past a
// cluster's error, and reports them all.
func (c *Coordinator) returnAcross(ctx context.Context, orderID string, groups []*orderGroup, cancel bool) (*OrderReleased, error) {
	out := &OrderReleased{Order: orderID}
	if cancel {
		// A cancel is an abort: refused once the order is committed (its
		// lines are being confirmed; Release gives a confirmed order back).
		committed, err := c.fleet.abortDecision(ctx, orderID, acrossSKUs(groups))
		if err != nil {
			return nil, err
		}
		if committed {
			return nil, fmt.Errorf("cancel order %q: %w: the order is committed (its lines are confirmed, or being confirmed): "+
				"release it instead", orderID, ErrConflict)
		}
	}
	var errs []error
	for _, g := range groups {
		err := g.m.connected(ctx)
		var r *OrderReleased
		if err == nil {
			if cancel {
				r, err = g.m.c.stock.CancelOrder(ctx, g.lines[0].SKU, orderID)
			} else {
				r, err = g.m.c.stock.ReleaseOrder(ctx, g.lines[0].SKU, orderID)
			}
		}
		if err != nil {
			errs = append(errs, g.m.wrap(err))
			continue
		}
		out.Lines = append(out.Lines, r.Lines...)
		out.Released = out.Released || r.Released
		out.Revision = max(out.Revision, r.Revision)
		out.State = r.State
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	slices.SortFunc(out.Lines, func(a, b *segments.Released) int { return strings.Compare(a.SKU, b.SKU) })
	return out, nil
}

// lineAcross runs Release (cancel false) or Cancel (cancel true) of one
// SKU of an order over several clusters on the whole order, and answers
// for that SKU's line; ok is false when the order is not one over several
// clusters (the caller goes on as for any order).
func (c *Coordinator) returnLineAcross(ctx context.Context, sku, orderID string, cancel bool) (r *Released, ok bool, err error) {
	groups, err := c.acrossOf(ctx, sku, orderID)
	if err != nil {
		return nil, true, err
	}
	if groups == nil {
		return nil, false, nil
	}
	out, err := c.returnAcross(ctx, orderID, groups, cancel)
	if err != nil {
		return nil, true, err
	}
	for _, l := range out.Lines {
		if l.SKU == sku {
			return l, true, nil
		}
	}
	return nil, false, nil
}

// confirmLineAcross is Confirm of one SKU of an order over several
// clusters: every cluster's lines confirmed; it answers for that SKU's
// line.
func (c *Coordinator) confirmLineAcross(ctx context.Context, sku, orderID string) (r *Confirmed, ok bool, err error) {
	groups, err := c.acrossOf(ctx, sku, orderID)
	if err != nil {
		return nil, true, err
	}
	if groups == nil {
		return nil, false, nil
	}
	out, err := c.confirmAcross(ctx, orderID, groups)
	if err != nil {
		return nil, true, err
	}
	for _, l := range out.Lines {
		if l.SKU == sku {
			return l, true, nil
		}
	}
	return nil, false, nil
}
