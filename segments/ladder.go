package segments

import (
	"context"
	"errors"
	"time"

	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/lock"
)

// The ladder. An order looks for its stock in this order, cheapest first,
// and stops at the first rung that serves, refuses or fails it:
//
//  1. held:  a segment this process holds (a tenure): no lock round trip,
//     its units reserved in the segment's cache (a step order takes a free
//     slot there, slots.go; a plain order needs none, local.go).
//  2. look:  the whole SKU at one revision no older than the order's start,
//     read once for every order of this process that looks at the same
//     moment (look.go). A replay if the order ID was used meanwhile; a
//     refusal if the SKU holds too little in all (this is where a sold-out
//     SKU's orders end, without a lock or a wait); else the inboxes of the
//     held segments, as read, go into their caches (refills and releases
//     land there) and the order goes back to rung 1 if they hold it now.
//  3. pull:  when the look saw stock in the pool, some of it is moved into a
//     held segment's inbox in a short move under the pool's lock (pull.go).
//  4. grow:  one more segment within the fair share: a free one the look saw
//     holding the quantity (grow.go).
//  5. whole: the places that hold the quantity alone, as the look saw them
//     (gather.go): the pool by a pull into a held segment, and for an order
//     without a step under the pool's own lock; a segment under its lock,
//     waited for at most FallbackWait; when the stock is only in segments
//     other processes hold, fresh looks first (maxRelooks), for they sell
//     it.
//  6. gather: several places at once, locked in the global order and taken
//     from in one transaction, each lock waited for at most FallbackWait.
//
// Rungs 2 to 4 send the order back to rung 1 when they found stock (only
// the oldest waiting step order climbs them, the others wait for it); rungs
// 5 and 6 finding too little send it back to a fresh look, the stock having
// moved. An order whose lock was lost (nothing deducted) starts again at
// rung 1, at most maxLostRetries times, unless its step already ran.

// maxLostRetries bounds how often one allocation starts over after a lost
// lock or session (each start-over deducted nothing).
const maxLostRetries = 3

// poolPulls is how many pulls an order at rung 5 takes part in while the
// pool holds its quantity (others' orders may take what one brought).
const poolPulls = 3

// maxRelooks is how many fresh looks an order takes, at rung 5, while the
// stock it needs is only in segments other processes hold, before it waits
// for one of their locks: those processes are selling it, and a look is
// far cheaper than a lock handoff.
const maxRelooks = 6

// relookPause is the pause before such a fresh look.
const relookPause = 2 * time.Millisecond

// sell is the one path of an order: down the ladder until a rung serves,
// refuses or fails it.
func (e *Engine) sell(ctx context.Context, req *allocReq, home int) (*Allocation, error) {
	if req.step != nil {
		// A retry of an applied order must not run the step again: look
		// before taking any slot. A duplicate racing the first application
		// may still run the step; the commit's order-ID compare lets only
		// one deduct.
		rec, err := e.kv.Get(ctx, e.orderKey(req))
		if err != nil {
			return nil, err
		}
		if len(rec.Kvs) > 0 {
			return e.replay(ctx, req, rec.Kvs[0])
		}
	}
	s, err := e.seller(req.sku)
	if err != nil {
		return nil, err
	}
	defer s.release()
	lostRetries := 0
	r := s.serve(ctx, req, home) // rungs 1 to 4
	for {
		switch r.kind {
		case resServed:
			return r.alloc, nil
		case resFailed:
			if !r.retryable() || req.step != nil || lostRetries >= maxLostRetries {
				return nil, r.err
			}
			lostRetries++
			r = s.serve(ctx, req, home)
		default: // resShort, resBusy
			r = e.whole(ctx, s, req, home, r.snap) // rungs 5 and 6
		}
	}
}

// whole is rungs 5 and 6: the places that hold the quantity alone, as snap
// (the order's look, or nil for a fresh one) saw them, then a gather.
func (e *Engine) whole(ctx context.Context, s *seller, req *allocReq, home int, snap *snapshot) placeResult {
	for relooks := 0; ; relooks++ {
		if err := context.Cause(ctx); err != nil {
			return failed(err)
		}
		if snap == nil {
			var r placeResult
			var final bool
			if snap, r, final = s.lookAt(ctx, req); final {
				return r
			}
		}
		waited := false // a place skipped because its holder is selling it
		for _, p := range snap.candidates(req.qty, home) {
			if p.IsPool() {
				// The pool is moved into a segment this process holds and
				// sold there, a pull serving every order of the moment; a
				// step order does not wait for the pool's lock here (only
				// a gather may hold it through a step), and a plain one
				// only when this process can hold no segment to pull into.
				for range poolPulls {
					ok, err := s.pullFromPool(ctx, req, home)
					if err != nil {
						return failed(err)
					}
					if !ok {
						break
					}
					if r := s.serve(ctx, req, home); r.kind != resShort {
						return r
					}
				}
				if req.step != nil || s.pullTarget(home) >= 0 {
					continue
				}
			} else if relooks < maxRelooks && s.heldByOthers([]Place{p}) {
				// Its holder is selling it: look again shortly (a shared
				// read) rather than queue for its lock (two writes).
				waited = true
				continue
			}
			if r := e.tryPlace(ctx, req, p, e.cfg.FallbackWait); r.kind != resShort && r.kind != resBusy {
				return r
			}
		}
		if waited {
			if !background.Sleep(ctx, relookPause) {
				return failed(context.Cause(ctx))
			}
			snap = nil
			continue
		}
		return e.gather(ctx, req, snap)
	}
}

// rung names the dry rungs (2 to 4) for dryRungs.
type rung int

const (
	rungLook rung = iota + 2
	rungPull
	rungGrow
)

// rungActions is what the dry rungs do; the seller does it, tests fake it.
type rungActions interface {
	// lookAt takes a look: final means it answered the order (a refusal,
	// a replay, an error); otherwise found says whether the held segments
	// can now give the order's quantity.
	lookAt(ctx context.Context, req *allocReq) (snap *snapshot, r placeResult, final bool)
	heldCanGive(qty int64) bool
	// directCanGive: the order may be sold directly (direct.go) and the
	// look found it a segment for that.
	directCanGive(req *allocReq, home int) bool
	pullFromPool(ctx context.Context, req *allocReq, home int) (bool, error)
	growInto(ctx context.Context, home int, snap *snapshot, qty int64) bool
}

// dryRungs are rungs 2 to 4, each taken once per order, in turn, when no
// held segment can give the order's quantity. The pool comes before other
// segments so that a process stays within its share while the pool lasts.
type dryRungs struct {
	taken int
	snap  *snapshot // the order's look, once taken
}

// climb takes the next dry rung. again means it found stock (back to rung
// 1); otherwise the result answers the order (a refusal, a replay, a
// failure), or, once all three found nothing, is resShort (on to rung 5,
// carrying the look).
func (d *dryRungs) climb(ctx context.Context, a rungActions, req *allocReq, home int) (r placeResult, again bool) {
	for d.taken < 3 {
		next := rungLook + rung(d.taken)
		d.taken++
		var ok bool
		var err error
		switch next {
		case rungLook:
			var final bool
			if d.snap, r, final = a.lookAt(ctx, req); final {
				return r, false
			}
			ok = a.heldCanGive(req.qty) || a.directCanGive(req, home)
		case rungPull:
			if d.snap.pool > 0 {
				ok, err = a.pullFromPool(ctx, req, home)
			}
		case rungGrow:
			ok = a.growInto(ctx, home, d.snap, req.qty)
		}
		if err != nil {
			return failed(err), false
		}
		if ok {
			return placeResult{}, true
		}
	}
	return placeResult{kind: resShort, snap: d.snap}, false
}

// resultKind is what trying one rung or place came to.
type resultKind int

const (
	resShort  resultKind = iota // the place(s) held too little: try elsewhere
	resBusy                     // the lock stayed busy for the wait budget
	resServed                   // committed (or replayed): done
	resFailed                   // err says why; some errors allow starting over
)

type placeResult struct {
	kind  resultKind
	alloc *Allocation
	err   error
	snap  *snapshot // resShort from the dry rungs: the order's look
	raced bool      // resShort of a direct order: another writer moved or took its segment
}

func served(a *Allocation) placeResult { return placeResult{kind: resServed, alloc: a} }
func failed(err error) placeResult     { return placeResult{kind: resFailed, err: err} }

func result(a *Allocation, err error) placeResult {
	if err != nil {
		return failed(err)
	}
	return served(a)
}

// retryable reports whether the failure deducted nothing and a new attempt
// (on a new session) may succeed.
func (r placeResult) retryable() bool {
	return errors.Is(r.err, lock.ErrLost) || errors.Is(r.err, lock.ErrSessionLost)
}

// lockFailure turns a failed lock wait into a result.
func lockFailure(err error) placeResult {
	if errors.Is(err, lock.ErrLocked) {
		return placeResult{kind: resBusy}
	}
	return failed(err)
}
