package segments

import (
	"context"
	"fmt"

	"github.com/stockctl/stockctl/internal/lock"
)

// commitPart is the units an order takes from one place, reserved under
// the lock key own of the place's queue q (and pinned there: a tenure is not
// released while the commit is pending).
//
// A direct part (direct.go) holds no lock: its place is a segment this
// process owns for lazy sales, fenced by its counter's ModRevision.
type commitPart struct {
	st  *placeState
	q   *lock.Queue
	own *lock.Ownership
	qty int64

	direct bool
	// lowWatermark is the SKU's, for a direct part: a lazy segment whose
	// units fall below it has its counter written, so that the rebalancer
	// (which reads counters) sees it run low.
	lowWatermark int64
	lockPfx      string // the segment's lock prefix, for a direct part
}

// reservePart reserves qty on st under own and pins own; it reports false
// (and holds nothing) when the place cannot give qty or own is gone.
func reservePart(q *lock.Queue, own *lock.Ownership, st *placeState, qty int64) (commitPart, bool) {
	if !q.Pin(own) {
		return commitPart{}, false
	}
	if !st.reserve(own, qty) {
		q.Unpin(own)
		return commitPart{}, false
	}
	return commitPart{st: st, q: q, own: own, qty: qty}, true
}

// cancel gives back a part that will not be committed.
func (p commitPart) cancel() {
	if p.direct {
		p.st.unreserveDirect(p.qty)
		return
	}
	p.st.unreserve(p.own, p.qty)
	p.q.Unpin(p.own)
}

// commitReq is one order handed to the committer.
type commitReq struct {
	req   *allocReq
	parts []commitPart
	// ctx is the caller's: a request refused by a compare (nothing
	// deducted) is sent again while it lasts, up to maxCommitAttempts.
	ctx      context.Context
	attempts int
	done     chan struct{} // closed once res is set
	res      placeResult
}

func (r *commitReq) resolve(res placeResult) {
	r.res = res
	close(r.done)
}

// wait returns the request's result, or ctx's cause when ctx ends first
// (the commit may then still land: a retry under the same order ID tells).
func (r *commitReq) wait(ctx context.Context) placeResult {
	select {
	case <-r.done:
		return r.res
	case <-ctx.Done():
		return failed(fmt.Errorf("%w (the order was handed to a commit that may still land: retry with the same order ID to learn its outcome)", context.Cause(ctx)))
	}
}

// finish gives back every part and resolves the request.
func (r *commitReq) finish(res placeResult) {
	for _, p := range r.parts {
		p.cancel()
	}
	r.resolve(res)
}
