package segments

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/lock"
)

// Orders of several lines (a cart, a warehouse's outbound order): one order
// ID, N lines of (SKU, quantity), every line deducted or none, in one etcd
// transaction. The path is its own, beside the single-SKU ladder, and
// deliberately simple:
//
//  1. One read of every line's SKU at one revision (readLines): its
//     counters and inboxes, its place locks' keys, the order's record at
//     the line's key, the meta record (the incarnation) and the buyer's
//     counter. A record already there is a replay (or ErrConflict); a line
//     whose SKU held too little in all, at that revision, is the refusal,
//     true at that revision; likewise a buyer's per-user limit.
//  2. When every line can be served from places nobody holds a lock on
//     (the segments from the order's home, each counter and then its
//     inbox, never a lazy one; then the pool), one transaction (commitFree) comparing, per
//     place, the counter's (and an absorbed inbox's) ModRevision and that
//     the place's lock has no key at all, as the direct committer does;
//     per line the SKU's incarnation, the record's absence and the buyer's
//     counter. A failed compare reads everything again.
//  3. Otherwise (stock sits in segments other processes hold, or in lazy
//     ones), the places are locked in the global order (SKU name, then
//     the pool, then segments by index), each waited for at most
//     FallbackWait, and one transaction fenced by every lock takes from
//     them (commitHeld's way, heldplace.go).
//
// Each line writes its record at the existing key orders/<sku>/<id>,
// listing every SKU of the order (Order.Lines), so that whatever finds one
// line (a retry, Release, Cancel, Confirm, the expiry sweep) reaches all.
// The lines' books are each SKU's own: total = pool + Σ segments + Σ active
// orders + archive holds for every SKU at every revision, as every record
// is written in the transaction that moves its units.

// MaxOrderLines is the most lines one order may have. An order is one etcd
// transaction, so the server's --max-txn-ops (WithMaxTxnOps, 128 by
// default) bounds it too: a line costs at least four compares (its record's
// absence, its SKU's incarnation, one place's counter and lock) and two
// writes, so with the default at most 32 lines fit, fewer when a line takes
// from several places or has a buyer limit. An order that does not fit is
// refused with ErrInvalid before anything is written.
const MaxOrderLines = 64

// lineMinCmps is what one line costs a transaction at least, in compares
// (and its read in Gets): its record, its SKU's incarnation, one place's
// counter and lock.
const lineMinCmps = 4

// Line is one line of an order of several lines: a quantity of one SKU.
type Line struct {
	SKU string
	Qty int64
}

// OrderAllocation is the outcome of AllocateOrder and ReserveOrder.
type OrderAllocation struct {
	Order string
	// Lines are the lines' allocations, in the order the lines were given.
	Lines []*Allocation
	// Revision is the etcd revision at which every line was committed.
	Revision int64
	// Replayed is true when the order had been applied before this call:
	// nothing was deducted now, and the fields describe the first outcome.
	Replayed bool
	// Released is true when the order has since been released or
	// cancelled (only on a replay).
	Released bool
	// State and Deadline are the reservation's (ReserveOrder), as in
	// Allocation.
	State    OrderState
	Deadline time.Time
	Buyer    string
}

// LineError is the error of an order of several lines refused for one of
// its lines: the SKU held too little (Err is an *InsufficientStockError)
// or the buyer's limit of that SKU would be passed (*LimitExceededError).
// Index is the line's position in the order as given, from 0.
type LineError struct {
	Index int
	SKU   string
	Qty   int64
	Err   error
}

func (e *LineError) Error() string {
	return fmt.Sprintf("line %d (%s, qty %d): %v", e.Index, e.SKU, e.Qty, e.Err)
}

func (e *LineError) Unwrap() error { return e.Err }

// lineReq is one line of an order being allocated.
type lineReq struct {
	idx int // its position in the order as given
	req *allocReq
}

// ValidateLines checks an order's lines: 1 to MaxOrderLines of them, each
// with a valid SKU and quantity, no SKU twice.
func ValidateLines(lines []Line) error {
	if len(lines) == 0 || len(lines) > MaxOrderLines {
		return invalid("lines", len(lines), "must be between 1 and %d", MaxOrderLines)
	}
	seen := make(map[string]bool, len(lines))
	for i, l := range lines {
		if err := firstErr(ValidateSKU(l.SKU), ValidateQty(l.Qty)); err != nil {
			return fmt.Errorf("line %d: %w", i, err)
		}
		if seen[l.SKU] {
			return invalid("lines", l.SKU, "names SKU %q twice: one line per SKU", l.SKU)
		}
		seen[l.SKU] = true
	}
	return nil
}

// validRecordLines reports whether a record's Lines are well formed: 1 to
// MaxOrderLines distinct valid SKUs, sorted, sku among them.
func validRecordLines(sku string, lines []string) bool {
	if len(lines) == 0 || len(lines) > MaxOrderLines {
		return false
	}
	for i, s := range lines {
		if ValidateSKU(s) != nil || i > 0 && lines[i-1] >= s {
			return false
		}
	}
	_, found := slices.BinarySearch(lines, sku)
	return found
}

// AllocateOrder takes every line of an order, or none, in one transaction
// (coordinator.Coordinator.AllocateOrder documents the contract).
func (e *Engine) AllocateOrder(ctx context.Context, order string, lines []Line, opts ...OrderOption) (*OrderAllocation, error) {
	return e.allocateLines(ctx, "allocate", order, lines, 0, opts)
}

// ReserveOrder is AllocateOrder as a reservation of every line, with one
// deadline (coordinator.Coordinator.ReserveOrder documents it).
func (e *Engine) ReserveOrder(ctx context.Context, order string, lines []Line, ttl time.Duration, opts ...OrderOption) (*OrderAllocation, error) {
	return e.allocateLines(ctx, "reserve", order, lines, ttl, opts)
}

// maxFreeAttempts is how many transactions on free places an order of
// several lines tries before it locks the places instead: near a sell-out
// the places it reads keep moving under other processes' orders.
const maxFreeAttempts = 4

func (e *Engine) allocateLines(ctx context.Context, verb, order string, lines []Line, ttl time.Duration, opts []OrderOption) (out *OrderAllocation, outErr error) {
	defer func() { e.linesMetrics(verb, lines, out, outErr) }()
	var o orderOpts
	for _, opt := range opts {
		opt(&o)
	}
	fail := func(err error) (*OrderAllocation, error) {
		return nil, fmt.Errorf("%s order %q: %w", verb, order, err)
	}
	errs := []error{ValidateOrderID(order), ValidateLines(lines)}
	if o.buyer != "" {
		errs = append(errs, ValidateBuyer(o.buyer))
	}
	if verb == "reserve" {
		errs = append(errs, ValidateTTL(ttl))
	}
	if err := firstErr(errs...); err != nil {
		return fail(err)
	}
	if n := len(lines) * lineMinCmps; n > e.cfg.MaxTxnOps {
		return fail(invalid("lines", len(lines), "need at least %d compares in one transaction, more than the server's max-txn-ops %d (WithMaxTxnOps)", n, e.cfg.MaxTxnOps))
	}
	ls := make([]*lineReq, len(lines))
	for i, l := range lines {
		info, err := e.sku(ctx, l.SKU)
		if err != nil {
			return fail(fmt.Errorf("line %d (%s): %w", i, l.SKU, err))
		}
		req := &allocReq{sku: info, order: order, qty: l.Qty, ttl: ttl, buyer: o.buyer, home: Route(order, info.segments), across: o.across}
		if info.perUserLimit > 0 {
			if o.buyer == "" {
				return fail(fmt.Errorf("line %d (%s): %w", i, l.SKU, &InvalidError{Field: "buyer", Value: `""`,
					Reason: fmt.Sprintf("is required: the SKU has a per-user limit of %d", info.perUserLimit)}))
			}
			// A line over the limit by itself is refused by judgeLines,
			// after the records are read: a retry of an applied order
			// under its ID replays it or is ErrConflict, never a refusal.
			req.userKey = e.keys.User(l.SKU, o.buyer)
		}
		ls[i] = &lineReq{idx: i, req: req}
	}
	// Again with the buyers' counters: one more compare (and Get) for
	// each line of a SKU with a per-user limit.
	n := 0
	for _, l := range ls {
		n += lineMinCmps
		if l.req.userKey != "" {
			n++
		}
	}
	if n > e.cfg.MaxTxnOps {
		return fail(invalid("lines", len(lines), "need at least %d compares in one transaction, more than the server's max-txn-ops %d (WithMaxTxnOps)", n, e.cfg.MaxTxnOps))
	}
	// Every line has a record, all written at once: the first line's says
	// whether this is a retry.
	if err := e.guardNewOrder(ctx, lines[0].SKU, order); err != nil {
		return fail(err)
	}
	// The lines in the global lock order (SKU name), for the held path;
	// results go back in the order given.
	sorted := slices.Clone(ls)
	slices.SortFunc(sorted, func(a, b *lineReq) int { return strings.Compare(a.req.sku.name, b.req.sku.name) })
	skus := make([]string, len(sorted))
	for i, l := range sorted {
		skus[i] = l.req.sku.name
	}

	// First with the other carts of the moment (cartbatch.go); a cart the
	// batch could not decide goes on alone.
	cr := &cartReq{ls: sorted, skus: skus, n: len(ls), done: make(chan struct{})}
	e.carts.Submit(cr)
	select {
	case <-cr.done:
	case <-ctx.Done():
		return fail(fmt.Errorf("%w (the order was handed to a commit that may still land: retry with the same order ID to learn its outcome)", context.Cause(ctx)))
	}
	if !cr.alone {
		if cr.err != nil {
			return fail(cr.err)
		}
		return cr.res, nil
	}
	free := 0
	for attempt := 0; attempt < maxCommitAttempts; attempt++ {
		if attempt > 0 {
			if err := returnBackoff(ctx, attempt-1); err != nil {
				return fail(err)
			}
		}
		views, err := e.readLines(ctx, sorted)
		if err == nil {
			err = e.settleViews(ctx, sorted, views, false)
		}
		if err != nil {
			return fail(err)
		}
		if a, err, done := e.judgeLines(sorted, views, skus, len(ls)); done {
			if err != nil {
				return fail(err)
			}
			return a, nil
		}
		var a *OrderAllocation
		var retry bool
		if plan := planFree(sorted, views); plan != nil && free < maxFreeAttempts {
			free++
			a, retry, err = e.commitFree(ctx, sorted, views, plan, skus, len(ls))
		} else {
			// Exact counts before locking: the places to lock are those
			// with stock, and a line the lazy segments' sales left short
			// is refused here, true at the read's revision.
			if err := e.settleViews(ctx, sorted, views, true); err != nil {
				return fail(err)
			}
			if a, err, done := e.judgeLines(sorted, views, skus, len(ls)); done {
				if err != nil {
					return fail(err)
				}
				return a, nil
			}
			a, retry, err = e.commitLocked(ctx, sorted, views, skus, len(ls))
		}
		switch {
		case err != nil:
			return fail(err)
		case !retry:
			return a, nil
		}
	}
	return fail(errContention)
}

// lineView is one line's SKU as read by readLines.
type lineView struct {
	snap    *snapshot
	poolMod int64
	locked  map[Place]bool // places whose lock has a key (held or waited for)
	rec     *mvccpb.KeyValue
	user    int64 // the buyer's counter, when the SKU has a per-user limit
	userMod int64
	// narrow: only the counters of the line's home segment and of its
	// SKU's pool were read, not the home's inbox, the SKU's other places
	// nor its meta record (readHomes). Such a view can plan the line from
	// those two counters, never refuse it.
	narrow bool
}

// settleViews counts, in the views of ls that need it, the sales of
// their SKU's lazy segments not yet in the counters (lazy.go), at the
// views' revision: in every view when all is set (before the places are
// locked), else only where the SKU's total with the lazy segments at their
// counters' N (an upper bound) is short of the line's quantity, which is
// where a refusal may follow and must count exactly. That read ranges every
// record of the SKU (etcd filters by creation revision after reading), so
// a cart sale beside single orders that own lazy segments read each SKU's
// whole history a line: 6x fewer orders a second with 5 % of carts
// (docs/benchmarks.md, stop 48). Plans never take from lazy segments, so a
// cart served needs none of it.
func (e *Engine) settleViews(ctx context.Context, ls []*lineReq, views []*lineView, all bool) error {
	for i, v := range views {
		s := v.snap
		if len(s.lazy) == 0 || (!all && s.total() >= ls[i].req.qty) {
			continue
		}
		sold, err := e.unsettled(ctx, ls[i].req.sku.name, s.rev, s.lazy)
		if err != nil {
			return err
		}
		s.settleLazy(sold)
	}
	return nil
}

// readLines reads every line's SKU at one revision (see the top of the
// file). A SKU deleted or created again since this process read it is
// answered as such.
func (e *Engine) readLines(ctx context.Context, ls []*lineReq) ([]*lineView, error) {
	return e.readLineViews(ctx, ls, false)
}

// readHomes is readLines narrowed to what the cart batcher needs to plan a
// cart whose every line its home segment's counter and its SKU's pool can
// serve: per line those two counters (not the SKU's 2N+1 counters and
// inboxes), its SKU's lock keys, the record, the buyer's counter; no meta
// record (the commit compares the incarnation). A read of every counter of
// every line's SKU was most of what a cart cost etcd (its range reads a
// third of a cart sale's CPU, docs/benchmarks.md, stop 48), and beside
// single orders, which own their homes lazily, the pool is where a cart
// finds stock it may take. The views cannot refuse a line, nor judge a
// replay: the batcher reads in full for those (commitCarts).
func (e *Engine) readHomes(ctx context.Context, ls []*lineReq) ([]*lineView, error) {
	return e.readLineViews(ctx, ls, true)
}

func (e *Engine) readLineViews(ctx context.Context, ls []*lineReq, narrow bool) ([]*lineView, error) {
	var ops []clientv3.Op
	for _, l := range ls {
		name := l.req.sku.name
		if narrow {
			ops = append(ops,
				clientv3.OpGet(e.keys.Segment(name, l.req.home)),
				clientv3.OpGet(e.keys.Pool(name)))
		} else {
			ops = append(ops, clientv3.OpGet(e.keys.SKUStock(name), clientv3.WithPrefix()))
		}
		ops = append(ops,
			clientv3.OpGet(e.keys.StockLocks(name), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
			clientv3.OpGet(e.keys.Order(name, l.req.order)))
		if !narrow {
			ops = append(ops, clientv3.OpGet(e.keys.Meta(name), clientv3.WithKeysOnly()))
		}
		if l.req.userKey != "" {
			ops = append(ops, clientv3.OpGet(l.req.userKey))
		}
	}
	resp, err := e.kv.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("read stock: %w", err)
	}
	rev := resp.Header.Revision
	rs := resp.Responses
	views := make([]*lineView, len(ls))
	for i, l := range ls {
		info := l.req.sku
		stock := rs[0].GetResponseRange().GetKvs()
		if narrow {
			stock = append(stock[:len(stock):len(stock)], rs[1].GetResponseRange().GetKvs()...)
			rs = rs[1:] // then as a full read's, without the meta record
		} else if meta := rs[3].GetResponseRange().GetKvs(); info.created != 0 && (len(meta) == 0 || meta[0].CreateRevision != info.created) {
			e.forgetSKU(info)
			return nil, fmt.Errorf("line %d (%s): %w", l.idx, info.name, skuGoneErr(info, len(meta) == 0))
		}
		snap, err := e.decodeSnapshot(info, rev, stock)
		if err != nil {
			return nil, err
		}
		// A lazy segment counts at its counter's N here, an upper bound of
		// its units: no plan takes from it, and settleViews counts its
		// unsettled sales when a judgement needs them.
		v := &lineView{snap: snap, locked: map[Place]bool{}, narrow: narrow}
		for _, kv := range stock {
			if string(kv.Key) == e.keys.Pool(info.name) {
				v.poolMod = kv.ModRevision
			}
		}
		for _, kv := range rs[1].GetResponseRange().GetKvs() {
			k, err := e.keys.ParseStockLock(string(kv.Key))
			if err != nil {
				// Not a waiter key (a lock-delay record, say): count the
				// SKU's places as locked rather than guess.
				v.locked[Pool] = true
				for j := range info.segments {
					v.locked[Segment(j)] = true
				}
				continue
			}
			v.locked[Place(k.Index)] = true
		}
		if kvs := rs[2].GetResponseRange().GetKvs(); len(kvs) > 0 {
			v.rec = kvs[0]
		}
		if narrow {
			rs = rs[3:]
		} else {
			rs = rs[4:]
		}
		if l.req.userKey != "" {
			if v.user, v.userMod, err = decodeCounterKV(l.req.userKey, rs[0].GetResponseRange()); err != nil {
				return nil, err
			}
			rs = rs[1:]
		}
		views[i] = v
	}
	return views, nil
}

// judgeLines answers the order from what readLines read, when it can
// without a write: a replay (every line's record exists), ErrConflict, or
// a refusal of the first line (in the order given) that cannot be served.
// done is false when every line can be served at the read's revision.
func (e *Engine) judgeLines(ls []*lineReq, views []*lineView, skus []string, n int) (a *OrderAllocation, err error, done bool) {
	recs := 0
	for _, v := range views {
		if v.rec != nil {
			recs++
		}
	}
	if recs > 0 {
		a, err := e.replayLines(ls, views, skus, n)
		return a, err, true
	}
	var refused *LineError
	for i, l := range ls {
		v, req := views[i], l.req
		var why error
		if t := v.snap.total(); t < req.qty {
			why = &InsufficientStockError{SKU: req.sku.name, Want: req.qty, Remaining: t, Revision: v.snap.rev}
		} else if req.userKey != "" && v.user+req.qty > req.sku.perUserLimit {
			why = &LimitExceededError{SKU: req.sku.name, Buyer: req.buyer, Limit: req.sku.perUserLimit,
				Held: v.user, Want: req.qty, Revision: v.snap.rev}
		}
		if why != nil && (refused == nil || l.idx < refused.Index) {
			refused = &LineError{Index: l.idx, SKU: req.sku.name, Qty: req.qty, Err: why}
		}
	}
	if refused != nil {
		return nil, refused, true
	}
	return nil, nil, false
}

// replayLines answers an order whose ID has a record at one of its lines'
// keys: the first outcome when every line has its record and they agree
// with the request (the SKUs, each quantity, the kind, the buyer), else
// ErrConflict.
func (e *Engine) replayLines(ls []*lineReq, views []*lineView, skus []string, n int) (*OrderAllocation, error) {
	out := &OrderAllocation{Order: ls[0].req.order, Lines: make([]*Allocation, n), Replayed: true}
	for i, l := range ls {
		req, kv := l.req, views[i].rec
		if kv == nil {
			return nil, fmt.Errorf("%w: the order ID was already used on another SKU of the order, not on %s", ErrConflict, req.sku.name)
		}
		o, err := DecodeOrder(string(kv.Key), kv.Value)
		if err != nil {
			return nil, err
		}
		if o.SKU != req.sku.name || o.ID != req.order {
			return nil, &CorruptError{Key: string(kv.Key), Value: kv.Value, Err: fmt.Errorf("record names SKU %q order %q", o.SKU, o.ID)}
		}
		switch {
		case o.IsPruned():
			// Applied once, archived since (Prune): the claim refuses it.
			return nil, &OrderPrunedError{SKU: o.SKU, Order: o.ID, Pruned: o.PrunedAt}
		case o.Lines == nil:
			return nil, fmt.Errorf("%w: the order ID was already used on %s for an order of one SKU", ErrConflict, o.SKU)
		case !slices.Equal(o.Lines, skus):
			return nil, fmt.Errorf("%w: the order was already applied with the lines %s, not %s", ErrConflict,
				strings.Join(o.Lines, ","), strings.Join(skus, ","))
		case o.Qty != req.qty:
			return nil, fmt.Errorf("%w: line %d (%s) was already applied with qty %d, not %d", ErrConflict, l.idx, o.SKU, o.Qty, req.qty)
		case (o.State != "") != (req.ttl > 0):
			what := "a plain allocation"
			if o.State != "" {
				what = "a reservation"
			}
			return nil, fmt.Errorf("%w: the order was already applied as %s", ErrConflict, what)
		case o.Buyer != req.buyer:
			return nil, fmt.Errorf("%w: the order was already applied for buyer %q, not %q", ErrConflict, o.Buyer, req.buyer)
		}
		out.Lines[l.idx] = &Allocation{SKU: o.SKU, Order: o.ID, Qty: o.Qty, Parts: o.Parts,
			Revision: kv.CreateRevision, Replayed: true, Released: o.Released,
			State: o.State, Deadline: o.Deadline, Buyer: o.Buyer}
		out.Revision, out.Released, out.State, out.Deadline, out.Buyer = kv.CreateRevision, o.Released, o.State, o.Deadline, o.Buyer
	}
	return out, nil
}

// freeTake is what a line takes from one place nobody holds a lock on: from
// its counter, then from its inbox (absorbed: the counter becomes counter +
// inbox − take, the inbox 0).
type freeTake struct {
	place           Place
	fromCtr, fromIn int64
}

// planFree picks, for every line, places nobody holds that give its
// quantity: the segments in ring order from the order's home (a hash of
// its ID, so that concurrent orders of one SKU spread over its segments
// rather than all compare the pool's counter), skipping lazy ones, then
// the pool; nil when some line cannot be served so.
func planFree(ls []*lineReq, views []*lineView) [][]freeTake {
	plan := make([][]freeTake, len(ls))
	for i, l := range ls {
		v, left := views[i], l.req.qty
		s := v.snap
		n := len(s.segs)
		for k := 0; k < n && left > 0; k++ {
			j := (l.req.home + k) % n
			if v.locked[Segment(j)] || s.ctr[j].Lazy() || s.cnt[j]+s.inbox[j] <= 0 {
				continue
			}
			t := min(left, s.cnt[j]+s.inbox[j])
			c := min(t, s.cnt[j])
			plan[i] = append(plan[i], freeTake{place: Segment(j), fromCtr: c, fromIn: t - c})
			left -= t
		}
		if left > 0 && !v.locked[Pool] && s.pool > 0 {
			t := min(left, s.pool)
			plan[i] = append(plan[i], freeTake{place: Pool, fromCtr: t})
			left -= t
		}
		if left > 0 {
			return nil
		}
	}
	return plan
}

// linesTxn is an order's transaction being built.
type linesTxn struct {
	cmps  []clientv3.Cmp
	ops   []clientv3.Op
	parts [][]Part
}

// fits reports whether the transaction stays within the server's
// --max-txn-ops.
func (t *linesTxn) fits(max int) bool { return len(t.cmps) <= max && len(t.ops) <= max }

// addOrder adds what every order of several lines carries, whatever its
// places: per line the SKU's incarnation, the record's absence, the
// record (with its reservation index key) and the buyer's counter. All
// lines share one creation time, hence one deadline.
func (e *Engine) addOrder(t *linesTxn, ls []*lineReq, views []*lineView, skus []string) {
	e.addRecords(t, ls, skus, map[*skuInfo]bool{})
	for i, l := range ls {
		if req := l.req; req.userKey != "" {
			t.cmps = append(t.cmps, clientv3.Compare(clientv3.ModRevision(req.userKey), "=", views[i].userMod))
			t.ops = append(t.ops, clientv3.OpPut(req.userKey, EncodeCounter(views[i].user+req.qty)))
		}
	}
}

// addRecords adds an order's own compares and writes: per line its SKU's
// incarnation (once per SKU of incarnations, which it updates), its
// record's absence, its record and, for a reservation, its index key.
func (e *Engine) addRecords(t *linesTxn, ls []*lineReq, skus []string, incarnations map[*skuInfo]bool) {
	now := time.Now().UTC()
	for i, l := range ls {
		req := l.req
		if !incarnations[req.sku] {
			incarnations[req.sku] = true
			t.cmps = append(t.cmps, e.incarnation(req.sku)...)
		}
		t.cmps = append(t.cmps, e.orderAbsent(req.sku.name, req.order))
		rec := Order{SKU: req.sku.name, ID: req.order, Qty: req.qty, Parts: t.parts[i], Created: now,
			Buyer: req.buyer, UserCounted: req.userKey != "", Lines: skus, Across: req.across}
		if req.ttl > 0 {
			req.deadline = now.Add(req.ttl)
			rec.State, rec.Deadline = StateReserved, req.deadline
			t.ops = append(t.ops, clientv3.OpPut(e.keys.Reservation(req.sku.name, req.deadline.UnixNano(), req.order),
				EncodeCounter(req.qty)))
		}
		t.ops = append(t.ops, clientv3.OpPut(e.keys.Order(req.sku.name, req.order), EncodeOrder(rec)))
	}
}

// send commits t; ok is false when a compare failed (nothing written).
func (e *Engine) sendLines(ctx context.Context, t *linesTxn, ls []*lineReq, n int) (a *OrderAllocation, ok bool, err error) {
	if !t.fits(e.cfg.MaxTxnOps) {
		return nil, false, invalid("lines", len(ls), "need %d compares and %d writes in one transaction, more than the server's max-txn-ops %d (WithMaxTxnOps)",
			len(t.cmps), len(t.ops), e.cfg.MaxTxnOps)
	}
	resp, err := e.kv.Txn(ctx).If(t.cmps...).Then(t.ops...).Commit()
	for _, l := range ls {
		if l.req.userKey != "" {
			e.users.forget(l.req.userKey) // the committer reads it again
		}
	}
	if err != nil {
		return nil, false, fmt.Errorf("%w (the order may have been committed: retry with the same order ID to learn its outcome)", err)
	}
	if !resp.Succeeded {
		return nil, false, nil
	}
	rev := resp.Header.Revision
	out := &OrderAllocation{Order: ls[0].req.order, Lines: make([]*Allocation, n), Revision: rev, Buyer: ls[0].req.buyer}
	for i, l := range ls {
		out.Lines[l.idx] = e.allocation(l.req, t.parts[i], rev)
		out.State, out.Deadline = out.Lines[l.idx].State, out.Lines[l.idx].Deadline
	}
	return out, true, nil
}

// commitFree sends the order as planned on places nobody holds; retry when
// a compare failed.
func (e *Engine) commitFree(ctx context.Context, ls []*lineReq, views []*lineView, plan [][]freeTake, skus []string, n int) (*OrderAllocation, bool, error) {
	t := &linesTxn{parts: make([][]Part, len(ls))}
	for i, l := range ls {
		name, s := l.req.sku.name, views[i].snap
		for _, ft := range plan[i] {
			t.parts[i] = append(t.parts[i], Part{Place: ft.place, Qty: ft.fromCtr + ft.fromIn})
			key := e.counterKey(name, ft.place)
			t.cmps = append(t.cmps, clientv3.Compare(clientv3.CreateRevision(e.placeLock(name, ft.place)), "=", 0).WithPrefix())
			if ft.place.IsPool() {
				t.cmps = append(t.cmps, clientv3.Compare(clientv3.ModRevision(key), "=", views[i].poolMod))
				t.ops = append(t.ops, clientv3.OpPut(key, EncodeCounter(s.pool-ft.fromCtr)))
				continue
			}
			j := ft.place.Index()
			t.cmps = append(t.cmps, clientv3.Compare(clientv3.ModRevision(key), "=", s.cntMod[j]))
			if ft.fromIn == 0 {
				t.ops = append(t.ops, clientv3.OpPut(key, EncodeCounter(s.cnt[j]-ft.fromCtr)))
				continue
			}
			inKey := e.keys.Inbox(name, j)
			t.cmps = append(t.cmps, clientv3.Compare(clientv3.ModRevision(inKey), "=", s.inMod[j]))
			t.ops = append(t.ops, clientv3.OpPut(key, EncodeCounter(s.cnt[j]+s.inbox[j]-ft.fromCtr-ft.fromIn)),
				clientv3.OpPut(inKey, EncodeCounter(0)))
		}
	}
	e.addOrder(t, ls, views, skus)
	a, ok, err := e.sendLines(ctx, t, ls, n)
	if err != nil || ok {
		return a, false, err
	}
	return nil, true, nil
}

// commitLocked serves the order from places it locks: per line (in SKU
// order) the places that had stock at the read, in the global order (the
// pool, then segments by index), until they hold the line's quantity
// together; a place found empty under its lock is let go at once. One
// transaction fenced by every lock takes from them. retry when a lock was
// not had within FallbackWait, a place held less than read, or a compare
// failed: the caller reads again (and may then refuse).
func (e *Engine) commitLocked(ctx context.Context, ls []*lineReq, views []*lineView, skus []string, n int) (*OrderAllocation, bool, error) {
	var held []*heldPlace
	defer func() {
		for _, hp := range held {
			hp.unlock()
		}
	}()
	t := &linesTxn{parts: make([][]Part, len(ls))}
	for i, l := range ls {
		left := l.req.qty
		for _, p := range views[i].snap.withStock() {
			if left == 0 {
				break
			}
			hp, err := e.lockPlace(ctx, l.req.sku.name, p, e.cfg.FallbackWait)
			if errors.Is(err, lock.ErrLocked) {
				return nil, true, nil
			}
			if err != nil {
				return nil, false, err
			}
			if err := hp.load(ctx, true); err != nil {
				hp.unlock()
				if errors.Is(err, lock.ErrLost) {
					return nil, true, nil
				}
				return nil, false, err
			}
			take := min(left, hp.available())
			if take <= 0 {
				hp.unlock()
				continue
			}
			held = append(held, hp)
			hp.delta = -take
			left -= take
			t.parts[i] = append(t.parts[i], Part{Place: p, Qty: take})
			t.cmps = append(t.cmps, hp.cmps()...)
			t.ops = append(t.ops, hp.ops()...)
		}
		if left > 0 {
			return nil, true, nil // taken by others since the read
		}
	}
	e.addOrder(t, ls, views, skus)
	a, ok, err := e.sendLines(ctx, t, ls, n)
	switch {
	case err != nil || !ok:
		for _, hp := range held {
			hp.invalidate()
		}
		return nil, err == nil, err
	}
	for _, hp := range held {
		hp.committed(a.Revision)
	}
	return a, false, nil
}

// linesMetrics counts an order of several lines in the allocation metrics:
// each line served is an allocation of its SKU; a refusal counts for the
// refused line's SKU, any other failure for the first line's.
func (e *Engine) linesMetrics(verb string, lines []Line, out *OrderAllocation, err error) {
	if e.metrics == nil || len(lines) == 0 || ValidateLines(lines) != nil {
		return
	}
	if err == nil {
		for _, a := range out.Lines {
			e.metrics.allocated(verb, a.SKU, a, nil)
		}
		return
	}
	sku := lines[0].SKU
	var le *LineError
	if errors.As(err, &le) {
		sku = le.SKU
	}
	e.metrics.allocated(verb, sku, nil, err)
}
