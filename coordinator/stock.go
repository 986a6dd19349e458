package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/stockctl/stockctl/segments"
)

// The stock operations. Each delegates to the segment engine (package
// segments), whose types are the results: they are aliased here so that a
// service needs only this package.

// Allocation is the outcome of Allocate, AllocateFunc and Reserve: how much
// of a SKU an order took, and from where (see segments.Allocation for the
// fields).
type Allocation = segments.Allocation

// OrderOption adds to an order what not every caller needs (WithBuyer).
type OrderOption = segments.OrderOption

// Step is a business step run by AllocateFunc while the stock it will take
// is locked: check the stock, create the order, charge the card... Its ctx
// is cancelled if a lock is lost meanwhile. Returning an error cancels the
// allocation: nothing is deducted and AllocateFunc returns the error. A
// panic cancels it too, and reaches AllocateFunc's caller.
type Step = segments.Step

// Released is the outcome of Release and Cancel.
type Released = segments.Released

// Confirmed is the outcome of Confirm.
type Confirmed = segments.Confirmed

// Restocked is the outcome of Restock.
type Restocked = segments.Restocked

// SKUConfig describes a SKU to create (see segments.SKUConfig for each
// field's range and cost).
type SKUConfig = segments.SKUConfig

// Status is a SKU's stock at one revision, from Status.
type Status = segments.Status

// SegmentStatus is one segment's stock in a Status.
type SegmentStatus = segments.SegmentStatus

// AuditReport is the outcome of Audit.
type AuditReport = segments.AuditReport

// WithBuyer names the buyer an order is for. On a SKU with a per-user limit
// (SKUConfig.PerUserLimit) it is required, and the order is refused with
// ErrLimitExceeded when the buyer's units (confirmed and live reserved
// orders) would exceed the limit: the check and the deduction commit in one
// transaction. Elsewhere it is only recorded on the order. A buyer ID is 1
// to segments.MaxBuyerLen bytes of printable ASCII other than space and '/'.
// A retry of the order must name the same buyer. With AllocateFunc the
// limit is judged at the commit, after the step ran: a refused order's step
// must be undone like any step whose order failed.
func WithBuyer(buyer string) OrderOption { return segments.WithBuyer(buyer) }

// DefaultRefillBatch is the refill batch of a SKU created without one: a
// quarter of an even share of the total, at least 1.
func DefaultRefillBatch(total int64, segs int) int64 { return segments.DefaultRefillBatch(total, segs) }

// CreateSKU creates sku with cfg and returns its meta record. Creating an
// existing SKU is ErrConflict.
//
// Creation takes several transactions when the segments do not fit in one
// (etcd's --max-txn-ops): all stock is first put in the pool, then moved to
// the segments in batches, so that total = pool + segments holds at every
// revision. Until the last step the SKU serves no requests (ErrUnknownSKU).
// If creation is interrupted, calling CreateSKU again with the same config
// completes it; another config, another InitialFill included, is
// ErrConflict naming the config of the creation in progress (nothing
// changes). The result's InitialFill is the fill the segments were given.
//
// Over several clusters (NewClusters) the SKU is placed in the cluster its
// name hashes to, unless its name is already placed (an interrupted
// creation, or a SKU created with CreateSKUIn), and stays there: see
// CreateSKUIn. A name that hashes to a cluster being removed (or removed,
// for a process still running with the old list) is placed by its hash
// over the other clusters.
func (c *Coordinator) CreateSKU(ctx context.Context, sku string, cfg SKUConfig) (segments.Meta, error) {
	switch {
	case c.fleet != nil:
		return c.fleet.createHashed(ctx, sku, cfg)
	case c.inFleet:
		return segments.Meta{}, fmt.Errorf("create %s: %w: this coordinator is one cluster of a fleet: create SKUs through the fleet's", sku, ErrInvalidArgument)
	}
	return c.stock.CreateSKU(ctx, sku, cfg)
}

// CreateSKUIn is CreateSKU in the named cluster of a coordinator over
// several. The name is claimed in the fleet's first cluster (the
// registry) before the SKU is created, so two creations of one name never
// both succeed, in one cluster or two; a name already placed in another
// cluster is ErrConflict naming it. The SKU stays in its cluster until
// DeleteSKU. On a one-cluster coordinator, cluster must be "".
func (c *Coordinator) CreateSKUIn(ctx context.Context, cluster, sku string, cfg SKUConfig) (segments.Meta, error) {
	if c.fleet == nil {
		if cluster != "" {
			return segments.Meta{}, fmt.Errorf("create %s: cluster %q: %w: this coordinator has one cluster", sku, cluster, ErrInvalidArgument)
		}
		return c.CreateSKU(ctx, sku, cfg)
	}
	return c.fleet.create(ctx, sku, cluster, cfg)
}

// Allocate takes qty units of sku for an order, and records the order.
//
// The order is served from the segments this process holds (it keeps a
// segment's lock across orders, up to its fair share of the SKU's
// segments), preferring its home segment, segments.Route(routeKey, N) (a
// random one when routeKey is empty). When they cannot serve it, it reads
// their inboxes (where refills and releases land), moves stock from the
// pool into one of them, takes one more segment within its fair share, and
// last looks at the whole SKU at one revision: it takes the stock from a
// place that holds qty alone (waiting a short while for its lock), or
// gathers it from several places in one transaction. It is refused with an
// *InsufficientStockError only when, at one etcd revision, the pool and all
// segments together held less than qty.
//
// Every deduction commits in an etcd transaction that checks the place's
// lock is still held and that creates the order record, so it is applied
// exactly once per order ID: calling Allocate again with the same order,
// SKU and qty returns the first result with Replayed set, deducting nothing;
// the same order ID with another qty is ErrConflict. Order IDs are unique
// per SKU: the same ID on another SKU is another order. After a timeout
// or a lost reply, retrying with the same order ID tells the true outcome.
//
// Concurrent orders of this process are committed together, in one
// transaction for every place and SKU of the moment (group commit). ctx
// bounds the wait; a request already handed to a group commit when ctx
// ends may still be committed (retry with the same order ID to learn the
// outcome).
func (c *Coordinator) Allocate(ctx context.Context, sku, order string, qty int64, routeKey string, opts ...OrderOption) (*Allocation, error) {
	return onSKU(ctx, c, sku, func(e *segments.Engine) (*Allocation, error) {
		return e.Allocate(ctx, sku, order, qty, routeKey, opts...)
	})
}

// AllocateFunc is Allocate with a business step: step runs while the locks
// of the place(s) the stock will come from are held and the stock is
// known to be there, and the deduction is committed only if step returns nil
// and the locks are still held. step's ctx is cancelled if a lock is lost.
// The next order on the same segment runs its step while this one's commit
// is in flight.
//
// If a lock is lost after step returned nil, AllocateFunc returns an error
// wrapping ErrLockLost and nothing is deducted: undo the step's effects, or
// retry with the same order ID (the step then runs again). A retry of an
// order that was applied returns the first result without running step;
// duplicates of one order ID sent at the same time may each run step, and
// exactly one of them deducts (the others return its result as a replay).
//
// If step panics, the panic goes on to AllocateFunc's caller unchanged,
// after the order has been cleaned up as if step had returned an error:
// nothing is deducted or recorded, the units reserved for it are given back
// and the locks and the place in the process's queue it held are released,
// so a service that recovers from the panic keeps selling the SKU. Undo
// what step did before it panicked, as for any failed step.
func (c *Coordinator) AllocateFunc(ctx context.Context, sku, order string, qty int64, routeKey string, step Step, opts ...OrderOption) (*Allocation, error) {
	return onSKU(ctx, c, sku, func(e *segments.Engine) (*Allocation, error) {
		return e.AllocateFunc(ctx, sku, order, qty, routeKey, step, opts...)
	})
}

// Reserve takes qty units of sku for an order, as Allocate does (same
// routing, fallback and refusal rules, same idempotency by order ID), and
// records the order as a reservation that expires ttl after its commit
// unless Confirm is called first. An expired reservation's units go back to
// the SKU (the inbox of the segment its order ID routes to, or, when the
// sweep expires many in one transaction, the one the first of them routes
// to), by the elected rebalancer's sweep (rebalance), normally well within
// a second of the deadline.
//
// ttl must be more than 0 and at most segments.MaxReservationTTL. A retry
// with the same order, SKU, qty and buyer returns the first result with
// Replayed set (and the first deadline: the new ttl is ignored); an order ID
// already used on this SKU for a plain allocation, or with another qty or
// buyer, is ErrConflict. On a SKU with a per-user limit, WithBuyer is required and
// the reservation counts against the buyer's limit until it expires or is
// cancelled.
func (c *Coordinator) Reserve(ctx context.Context, sku, order string, qty int64, routeKey string, ttl time.Duration, opts ...OrderOption) (*Allocation, error) {
	return onSKU(ctx, c, sku, func(e *segments.Engine) (*Allocation, error) {
		return e.Reserve(ctx, sku, order, qty, routeKey, ttl, opts...)
	})
}

// Confirm makes a live reservation a final allocation, in one transaction
// that compares the reservation's record as read and deletes its index key.
// It is idempotent: confirming a confirmed reservation returns the first
// confirmation with Replayed set. Confirms of this process are committed
// together.
//
// Errors, each changing nothing: ErrOrderNotFound (no such order of sku);
// *ExpiredError (ErrExpired) when the reservation expired, including when
// this call finds it past its deadline by this process's clock and not yet
// swept: Confirm then expires it itself (its units go back, in the same
// fenced way as the sweep), so that ErrExpired is final and a later Confirm
// elsewhere cannot succeed; ErrConflict for a plain allocation (nothing to
// confirm) and for a reservation that was cancelled or released.
func (c *Coordinator) Confirm(ctx context.Context, sku, order string) (*Confirmed, error) {
	if c.fleet != nil { // an order of several lines over several clusters: every cluster's lines
		if r, ok, err := c.confirmLineAcross(ctx, sku, order); ok {
			return r, err
		}
	}
	return onSKU(ctx, c, sku, func(e *segments.Engine) (*Confirmed, error) { return e.Confirm(ctx, sku, order) })
}

// Cancel gives a live reservation's units back (to the places they came
// from, as Release does) and marks it released, in one transaction. It is
// idempotent: cancelling a cancelled reservation reports Released false.
//
// Cancel is only for reservations. Errors, each changing nothing:
// ErrOrderNotFound; ErrConflict for a confirmed reservation (a paid order
// goes back with Release, which says so explicitly) and for a plain
// allocation; *ExpiredError (ErrExpired) for a reservation that expired, its
// units already back.
func (c *Coordinator) Cancel(ctx context.Context, sku, order string) (*Released, error) {
	if c.fleet != nil { // an order of several lines over several clusters: every cluster's lines
		if r, ok, err := c.returnLineAcross(ctx, sku, order, true); ok {
			return r, err
		}
	}
	return onSKU(ctx, c, sku, func(e *segments.Engine) (*Released, error) { return e.Cancel(ctx, sku, order) })
}

// Release returns an order's stock and marks the order released, in one
// transaction: its units go to the inbox of the segment the order's ID
// routes to (which counts as the segment's stock at once), whichever places
// they came from (stock is fungible; the rebalancer drains back what a
// segment does not sell). The Releases and Cancels of this process waiting
// at one moment share that transaction (its compares are each order's and
// each counter's own), and a SKU's units in it go to the inbox the first of
// them routes to. It takes no lock, so it never waits for, nor disturbs,
// the processes selling or pulling. Releasing again reports Released false and returns nothing;
// an order that was never allocated is ErrOrderNotFound. The order ID stays
// used: allocating it again replays the (released) first result.
//
// A live reservation can be released (as Cancel does); a confirmed one too
// (a paid order returned). A reservation that expired is *ExpiredError: its
// units went back already. Units counted against a buyer's per-user limit
// are taken off the buyer's counter in the same transaction.
func (c *Coordinator) Release(ctx context.Context, sku, order string) (*Released, error) {
	if c.fleet != nil { // an order of several lines over several clusters: every cluster's lines
		if r, ok, err := c.returnLineAcross(ctx, sku, order, false); ok {
			return r, err
		}
	}
	return onSKU(ctx, c, sku, func(e *segments.Engine) (*Released, error) { return e.Release(ctx, sku, order) })
}

// Restock adds a new delivery of qty units to sku's pool and total (a
// returned order is Release, not Restock). It holds the pool's lock, and
// claims the delivery ID in the transaction that adds the units.
//
// The delivery ID is required (1 to segments.MaxDeliveryIDLen bytes of
// printable ASCII other than space and '/'), and makes Restock idempotent
// as an order ID makes Allocate: calling it again with the same delivery,
// SKU and qty returns the first result with Replayed set and adds nothing;
// the same delivery ID with another SKU or qty is ErrConflict. Delivery IDs
// are unique across SKUs. Use the supplier's delivery note, a purchase
// order line: an ID that names the delivery, not the attempt.
//
// ctx bounds the wait for the pool's lock and the commit. After a timeout
// or a lost reply the restock may still land: retry with the same delivery
// ID to learn the outcome; it never adds the delivery twice. Audit counts
// the deliveries of a SKU.
func (c *Coordinator) Restock(ctx context.Context, sku, delivery string, qty int64) (*Restocked, error) {
	return onSKU(ctx, c, sku, func(e *segments.Engine) (*Restocked, error) { return e.Restock(ctx, sku, delivery, qty) })
}

// NextExpiry returns the earliest deadline among sku's live reservations,
// and false when none is live: the soonest that units held by unpaid
// reservations may come back to the SKU (the rebalancer's sweep expires a
// reservation normally well within a second of its deadline). A shop can
// tell a buyer refused with ErrInsufficientStock whether stock may come
// back, and when, without the full read of Status: this is one read of
// etcd's reservation index, keys only, one key. An invalid or unknown SKU
// is an error.
func (c *Coordinator) NextExpiry(ctx context.Context, sku string) (time.Time, bool, error) {
	type next struct {
		at time.Time
		ok bool
	}
	n, err := onSKU(ctx, c, sku, func(e *segments.Engine) (next, error) {
		at, ok, err := e.NextExpiry(ctx, sku)
		return next{at, ok}, err
	})
	return n.at, n.ok, err
}

// Status reads sku's stock in one transaction, so every figure is from the
// same revision.
func (c *Coordinator) Status(ctx context.Context, sku string) (*Status, error) {
	return onSKU(ctx, c, sku, func(e *segments.Engine) (*Status, error) { return e.Status(ctx, sku) })
}

// Audit checks sku's books at the current revision: the meta record's total
// must equal the pool, plus every segment's counter and inbox, plus the
// quantities of all active order records, all read in one transaction.
// Every value is decoded strictly, and every order's parts must name places
// of the SKU. Every live reservation must have its index key (with its
// quantity) and every index key a live reservation; every buyer's counter
// must equal the units its active orders counted there hold. Every delivery
// record (Restock) must decode and name the SKU, and the deliveries
// together cannot exceed the total. A failed audit is reported in the
// report (OK false), not as an error; errors are for failing to read.
func (c *Coordinator) Audit(ctx context.Context, sku string) (*AuditReport, error) {
	return onSKU(ctx, c, sku, func(e *segments.Engine) (*AuditReport, error) { return e.AuditAt(ctx, sku, 0) })
}

// AuditAt is Audit at a past revision rev (0: the current one). etcd keeps
// past revisions until they are compacted.
func (c *Coordinator) AuditAt(ctx context.Context, sku string, rev int64) (*AuditReport, error) {
	return onSKU(ctx, c, sku, func(e *segments.Engine) (*AuditReport, error) { return e.AuditAt(ctx, sku, rev) })
}

// Pruned is the outcome of Prune; Deleted of DeleteSKU.
type (
	Pruned  = segments.Pruned
	Deleted = segments.Deleted
)

// Prune archives sku's orders created before before: what they held is
// added to the SKU's archive record and each order's record is replaced by
// a small claim of its ID, in the same transactions, so that Status and
// Audit still balance (total = pool + segments + active orders +
// archived). Live reservations are kept.
//
// A pruned order's ID is kept for a retention (KeepPrunedIDs; 24 h by
// default, counted from the prune): a retry of the order within it is
// refused with ErrOrderPruned, never applied again, and so are a Release,
// Cancel or Confirm of it. A later Prune forgets the IDs whose retention
// ended; a retry after that is a new order, so keep the IDs longer than
// any client retries. A pruned active order counted against a per-user
// limit leaves its buyer's counter. ctx bounds the call; on failure what
// was pruned stays pruned (each batch in one balanced transaction) and
// calling again goes on. See docs/operations.md.
func (c *Coordinator) Prune(ctx context.Context, sku string, before time.Time, opts ...PruneOption) (*Pruned, error) {
	return onSKU(ctx, c, sku, func(e *segments.Engine) (*Pruned, error) { return e.Prune(ctx, sku, before, opts...) })
}

// PruneOption changes how Prune archives.
type PruneOption = segments.PruneOption

// KeepPrunedIDs sets how long Prune keeps the ID of each order it archives
// (DefaultPrunedIDRetention if not given): a retry of the order, or a
// Release, Cancel or Confirm of it, gets ErrOrderPruned while the ID is
// kept. 0 forgets the IDs at once (and every ID an earlier Prune kept): a
// retry of a pruned order is then a new order. A negative value is
// ErrInvalidArgument.
func KeepPrunedIDs(d time.Duration) PruneOption { return segments.KeepPrunedIDs(d) }

// DefaultPrunedIDRetention is how long Prune keeps pruned orders' IDs by
// default.
const DefaultPrunedIDRetention = segments.DefaultPrunedIDRetention

// DeleteSKU deletes a SKU that is done: no live reservation and no process
// holding or waiting for the lock of its pool or a segment (otherwise
// ErrConflict, naming which). Its orders are archived as Prune does, then
// every key of the SKU is deleted in one transaction; stock left in it goes
// too. The name may be created again, with any segment count: a process
// that cached the old SKU fails its next order cleanly (ErrUnknownSKU, or
// ErrConflict if the SKU was created again: retry it), writing nothing, and
// reads the SKU again.
//
// Over several clusters, the name's placement is forgotten once the SKU is
// deleted, so it may be created again in any cluster; DeleteSKU of a name
// whose SKU is gone but whose placement remains (an interrupted delete)
// forgets it and returns ErrUnknownSKU.
func (c *Coordinator) DeleteSKU(ctx context.Context, sku string) (*Deleted, error) {
	if c.fleet == nil {
		return c.stock.DeleteSKU(ctx, sku)
	}
	d, err := onSKU(ctx, c, sku, func(e *segments.Engine) (*Deleted, error) { return e.DeleteSKU(ctx, sku) })
	if err != nil && !errors.Is(err, ErrUnknownSKU) {
		return d, err
	}
	if uerr := c.fleet.unplace(ctx, sku); uerr != nil {
		return d, fmt.Errorf("delete %s: forget its placement: %w", sku, uerr)
	}
	return d, err
}

// SKUs lists the SKUs whose creation has completed, in name order.
//
// Over several clusters it lists every cluster's, at once; a cluster that
// cannot be read fails the call, naming it (ClusterSKUs lists the others).
func (c *Coordinator) SKUs(ctx context.Context) ([]string, error) {
	if c.fleet == nil {
		return c.stock.SKUs(ctx)
	}
	var all []string
	var errs []error
	for _, l := range c.ClusterSKUs(ctx) {
		all = append(all, l.SKUs...)
		if l.Err != nil {
			errs = append(errs, l.Err)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	slices.Sort(all)
	return all, nil
}

// ClusterListing is one cluster's SKUs, from ClusterSKUs.
type ClusterListing struct {
	Cluster string
	SKUs    []string
	Err     error // the cluster could not be read (a *ClusterError)
}

// ClusterSKUs lists the SKUs of every cluster, read at once, in the
// clusters' order; a one-cluster coordinator's listing has Cluster "".
func (c *Coordinator) ClusterSKUs(ctx context.Context) []ClusterListing {
	if c.fleet == nil {
		skus, err := c.stock.SKUs(ctx)
		return []ClusterListing{{SKUs: skus, Err: err}}
	}
	out := make([]ClusterListing, len(c.fleet.members))
	var wg sync.WaitGroup
	for i, m := range c.fleet.members {
		wg.Go(func() {
			out[i].Cluster = m.name
			if err := c.fleet.ready(ctx, m); err != nil {
				out[i].Err = err
				return
			}
			skus, err := m.c.stock.SKUs(ctx)
			out[i].SKUs, out[i].Err = skus, m.wrap(err)
		})
	}
	wg.Wait()
	return out
}

// Metrics bounds: the stock gauges cover the MetricsMaxSKUs SKUs this
// process touched most recently, each dropped after MetricsSKUIdle without
// a touch (see the package documentation's Metrics section).
const (
	MetricsMaxSKUs = segments.MetricsMaxSKUs
	MetricsSKUIdle = segments.MetricsSKUIdle
)

// Prepared is what Prepare did: the SKUs asked for, those whose first
// order here will sell without a read first (Ready), the segments this
// process owns for lazy sales (Owned) and the SKUs left to their first
// order (Skipped).
type Prepared = segments.Prepared

// Prepare readies this process to sell skus before their sale opens, so
// that their first orders here cost what later ones do. A process's first
// order of a SKU otherwise reads the segment it sells from and (with lazy
// segments, the default) writes its counter beside the order's record;
// in a sale of thousands of SKUs that opens at once nearly every early
// order is such a first one. Prepare does those reads and writes for many
// SKUs a transaction: it claims the process's seat, peeks at each SKU's
// segment for this process and takes it over (its counter rewritten with
// the same units, naming this process). No stock moves. A SKU created
// while this process held its seller seat (WithSellerSeat) was born with
// that segment named to it: Prepare only peeks there, and writes nothing.
//
// Call it shortly before the sale opens, in every process that will sell:
// what it prepares is kept while the SKU is in use, and forgotten once it
// has been idle for twice the tenure idle time (WithTenure; 20 s by
// default). Prepare again to renew it. A SKU this process holds a segment
// lock of, or whose segment for it is locked, owned by another process or
// empty, is skipped: its first order takes the usual path. Invalid or
// unknown SKUs are an error naming them, and nothing is prepared.
func (c *Coordinator) Prepare(ctx context.Context, skus ...string) (*Prepared, error) {
	if c.fleet == nil {
		return c.stock.Prepare(ctx, skus)
	}
	for _, sku := range skus {
		if err := segments.ValidateSKU(sku); err != nil {
			return nil, fmt.Errorf("prepare: %w", err)
		}
	}
	byMember := map[*member][]string{}
	var members []*member
	for _, sku := range skus {
		m, _, err := c.fleet.route(ctx, sku)
		if err != nil {
			return nil, fmt.Errorf("prepare: %w", err)
		}
		if byMember[m] == nil {
			members = append(members, m)
		}
		byMember[m] = append(byMember[m], sku)
	}
	for _, m := range members {
		if err := m.connected(ctx); err != nil {
			return nil, err
		}
		if err := m.c.stock.CheckSKUs(ctx, byMember[m]); err != nil {
			return nil, m.wrap(err) // before any cluster prepares
		}
	}
	out := &Prepared{}
	for _, m := range members {
		p, err := m.c.stock.Prepare(ctx, byMember[m])
		if p != nil {
			out.SKUs += p.SKUs
			out.Ready += p.Ready
			out.Owned += p.Owned
			out.Skipped += p.Skipped
		}
		if err != nil {
			return out, m.wrap(err)
		}
	}
	return out, nil
}
