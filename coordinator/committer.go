package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/segments"
)

// The committer is how an order's deduction reaches etcd. An order reserves
// its units on the place(s) it takes from (placeState.reserve) while it
// holds their locks, runs its business step, and hands a commitReq to the
// committer. The committer sends every request waiting at that moment, of
// every place and SKU of this process, in one transaction: for each place
// a compare that this process still holds its lock (the fence) and that
// the counter is as last committed, and the counter's new value; for each
// order a compare that its ID is unused, its claim and its record. One
// transaction is in flight at a time, so under load an order costs a
// fraction of one etcd write, and a place's next order runs its step while
// the previous one's commit is in flight (its reservation keeps the
// successor from planning with those units).
//
// A failed compare does not fail the batch silently: the Else branch reads
// every lock key, counter and order ID involved, and the committer answers
// the orders whose place was lost (ErrLockLost) or whose ID was already
// used (a replay), refreshes its cache, and sends the rest again.

// commitPart is the units an order takes from one place, reserved under
// the lock key own of the place's queue q (and pinned there: a tenure is not
// released while the commit is pending).
type commitPart struct {
	st  *placeState
	q   *lockQueue
	own *ownership
	qty int64
}

// reservePart reserves qty on st under own and pins own; it reports false
// (and holds nothing) when the place cannot give qty or own is gone.
func reservePart(q *lockQueue, own *ownership, st *placeState, qty int64) (commitPart, bool) {
	if !q.pin(own) {
		return commitPart{}, false
	}
	if !st.reserve(own, qty) {
		q.unpin(own)
		return commitPart{}, false
	}
	return commitPart{st: st, q: q, own: own, qty: qty}, true
}

// cancel gives back a part that will not be committed.
func (p commitPart) cancel() {
	p.st.unreserve(p.own, p.qty)
	p.q.unpin(p.own)
}

// commitReq is one order handed to the committer.
type commitReq struct {
	req      *allocReq
	parts    []commitPart
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

type committer struct {
	mu      sync.Mutex
	queue   []*commitReq
	running bool

	users userCache // buyers' counters (per-user limits)
}

// submit hands parts of req to the committer; the caller waits on the
// returned request.
func (c *Coordinator) submit(req *allocReq, parts []commitPart) *commitReq {
	cr := &commitReq{req: req, parts: parts, done: make(chan struct{})}
	cm := &c.stock.commit
	cm.mu.Lock()
	cm.queue = append(cm.queue, cr)
	start := !cm.running
	cm.running = true
	cm.mu.Unlock()
	if start && !c.goBackground(c.commitLoop) {
		c.failQueued(ErrClosed)
	}
	return cr
}

// failQueued answers every queued request with err (the coordinator closed).
func (c *Coordinator) failQueued(err error) {
	cm := &c.stock.commit
	cm.mu.Lock()
	q := cm.queue
	cm.queue, cm.running = nil, false
	cm.mu.Unlock()
	for _, cr := range q {
		cr.finish(failed(err))
	}
}

// finish gives back every part and resolves the request.
func (r *commitReq) finish(res placeResult) {
	for _, p := range r.parts {
		p.cancel()
	}
	r.resolve(res)
}

func (c *Coordinator) commitLoop(ctx context.Context) {
	for {
		if ctx.Err() != nil {
			c.failQueued(ErrClosed)
			return
		}
		batch := c.nextBatch()
		if batch == nil {
			return
		}
		c.commitBatch(ctx, batch)
	}
}

// Per order, a transaction needs one compare, two puts and one read in its
// Else; per place at most three compares, two puts and three reads.
const (
	orderCmps, orderPuts, orderGets = 1, 2, 1
	placeCmps, placePuts, placeGets = 3, 2, 3
)

// nextBatch takes the oldest waiting requests that fit one transaction
// (etcd's --max-txn-ops bounds compares, puts and reads separately). Two
// requests for one order ID never share a batch (the transaction would put
// its keys twice): the later one waits for the next, where it finds the ID
// used. It returns nil, and marks the committer idle, when nothing waits.
func (c *Coordinator) nextBatch() []*commitReq {
	cm := &c.stock.commit
	cm.mu.Lock()
	defer cm.mu.Unlock()
	if len(cm.queue) == 0 {
		cm.running = false
		return nil
	}
	limit := c.opts.maxTxnOps
	var cmps, puts, gets int
	places := map[*placeState]bool{}
	orders := map[string]bool{}
	users := map[string]bool{}
	var batch []*commitReq
	rest := cm.queue[:0]
	full := false
	for _, cr := range cm.queue {
		if full || orders[cr.req.order] {
			rest = append(rest, cr)
			continue
		}
		nc, np, ng := orderCmps, orderPuts, orderGets
		if cr.req.ttl > 0 {
			np++ // the reservation's index key
		}
		newUser := cr.req.userKey != "" && !users[cr.req.userKey]
		if newUser {
			nc, np, ng = nc+1, np+1, ng+1 // the buyer's counter
		}
		var fresh []*placeState
		for _, p := range cr.parts {
			if !places[p.st] {
				fresh = append(fresh, p.st)
				nc, np, ng = nc+placeCmps, np+placePuts, ng+placeGets
			}
		}
		if len(batch) > 0 && (cmps+nc > limit || puts+np > limit || gets+ng > limit) {
			full = true
			rest = append(rest, cr)
			continue
		}
		cmps, puts, gets = cmps+nc, puts+np, gets+ng
		for _, st := range fresh {
			places[st] = true
		}
		orders[cr.req.order] = true
		if newUser {
			users[cr.req.userKey] = true
		}
		batch = append(batch, cr)
	}
	clear(cm.queue[len(rest):])
	cm.queue = rest
	return batch
}

// batchPlace is one place of a batch: what the batch takes there and how.
type batchPlace struct {
	st       *placeState
	q        *lockQueue
	own      *ownership
	take     int64
	n        int   // parts
	value    int64 // the counter after the batch
	modRev   int64 // the counter's expected ModRevision
	absorb   bool
	inMod    int64
	lost     bool
	shortage bool
	err      error // reading the place failed
}

// commitBatch commits batch, or answers each request of it.
func (c *Coordinator) commitBatch(bg context.Context, batch []*commitReq) {
	for len(batch) > 0 {
		batch = c.commitGroup(bg, batch)
	}
}

// commitGroup commits batch, or answers each request of it, except those
// it defers: when a transaction failed only because another process
// changed a buyer's counter meanwhile, the requests of that buyer are
// returned to be sent after the others, so that one buyer ordering hard
// from several processes at once does not make everyone's commit fail.
func (c *Coordinator) commitGroup(bg context.Context, batch []*commitReq) (deferred []*commitReq) {
	ctx, cancel := context.WithTimeout(bg, c.opts.commitTimeout)
	defer cancel()
	for len(batch) > 0 {
		var users []*batchUser
		if users, batch = c.planUsers(ctx, batch); len(batch) == 0 {
			return
		}
		places, order := c.planBatch(ctx, batch)
		// Answer what cannot be committed: places lost, or holding less
		// than their reservations (their cache was refreshed).
		keep := batch[:0:0]
		for _, cr := range batch {
			switch {
			case cr.touches(places, func(bp *batchPlace) bool { return bp.lost }):
				cr.finish(failed(ErrLockLost))
			case cr.touches(places, func(bp *batchPlace) bool { return bp.err != nil }):
				cr.finish(failed(cr.placeErr(places)))
			case cr.touches(places, func(bp *batchPlace) bool { return bp.shortage }):
				cr.finish(failed(fmt.Errorf("stock changed under the lock after the business step; nothing deducted: %w", errContention)))
			case cr.attempts >= maxCommitAttempts:
				cr.finish(failed(errContention))
			default:
				cr.attempts++
				keep = append(keep, cr)
			}
		}
		dropped := len(keep) != len(batch)
		batch = keep
		if len(batch) == 0 {
			return
		}
		if dropped || len(places) != countPlaces(batch) {
			// Some request was dropped (with its place, or alone after
			// too many attempts): what the plan takes from its places and
			// adds to its buyers included it. Plan again.
			continue
		}

		var cmps []clientv3.Cmp
		var ops, diag []clientv3.Op
		for _, bp := range order {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(bp.own.key), "=", bp.own.rev),
				clientv3.Compare(clientv3.ModRevision(bp.st.key), "=", bp.modRev))
			ops = append(ops, clientv3.OpPut(bp.st.key, segments.EncodeCounter(bp.value)))
			if bp.absorb {
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(bp.st.inKey), "=", bp.inMod))
				ops = append(ops, clientv3.OpPut(bp.st.inKey, segments.EncodeCounter(0)))
			}
			diag = append(diag, clientv3.OpGet(bp.own.key), clientv3.OpGet(bp.st.key))
			if bp.st.inKey != "" {
				diag = append(diag, clientv3.OpGet(bp.st.inKey))
			}
		}
		partsOf := make([][]segments.Part, len(batch))
		for i, cr := range batch {
			partsOf[i] = cr.segmentParts()
			cmps = append(cmps, c.orderAbsent(cr.req.order))
			ops = append(ops, c.orderPuts(cr.req, partsOf[i])...)
			diag = append(diag, clientv3.OpGet(c.keys.OrderID(cr.req.order)))
		}
		// The buyers' counters go last, so that the Else reads above keep
		// the order diagnose expects.
		ucmps, uops, udiag := userCmpsOps(users)
		cmps, ops, diag = append(cmps, ucmps...), append(ops, uops...), append(diag, udiag...)
		sent := time.Now()
		resp, err := c.kv.Txn(ctx).If(cmps...).Then(ops...).Else(diag...).Commit()
		c.metrics.committed(len(batch), time.Since(sent), commitOutcome(resp, err))
		if err != nil {
			// The outcome is unknown: the orders' callers retry under the
			// same IDs to learn it, and the places are read again before
			// their next commit.
			for _, bp := range order {
				bp.st.invalidate()
			}
			c.settleUsers(users, 0, nil)
			for _, cr := range batch {
				cr.finish(failed(err))
			}
			return
		}
		if resp.Succeeded {
			rev := resp.Header.Revision
			for _, bp := range order {
				bp.st.settle(bp.own, bp.take, bp.n, bp.value, rev, bp.absorb)
			}
			c.settleUsers(users, rev, nil)
			for i, cr := range batch {
				for _, p := range cr.parts {
					p.q.unpin(p.own)
				}
				cr.resolve(served(c.allocation(cr.req, partsOf[i], rev)))
			}
			return
		}
		tail := resp.Responses[len(resp.Responses)-len(users):]
		c.settleUsers(users, 0, tail)
		batch = c.diagnose(ctx, batch, order, resp.Responses)
		if hot := changedUsers(users, tail); len(hot) > 0 {
			var cool, later []*commitReq
			for _, cr := range batch {
				if hot[cr.req.userKey] {
					later = append(later, cr)
				} else {
					cool = append(cool, cr)
				}
			}
			if len(cool) > 0 && len(later) > 0 {
				batch, deferred = cool, append(deferred, later...)
			}
		}
	}
	return deferred
}

func countPlaces(batch []*commitReq) int {
	seen := map[*placeState]bool{}
	for _, cr := range batch {
		for _, p := range cr.parts {
			seen[p.st] = true
		}
	}
	return len(seen)
}

// touches reports whether any of r's places satisfies f.
func (r *commitReq) touches(places map[*placeState]*batchPlace, f func(*batchPlace) bool) bool {
	for _, p := range r.parts {
		if bp := places[p.st]; bp != nil && f(bp) {
			return true
		}
	}
	return false
}

// placeErr is the first read error among r's places.
func (r *commitReq) placeErr(places map[*placeState]*batchPlace) error {
	for _, p := range r.parts {
		if bp := places[p.st]; bp != nil && bp.err != nil {
			return bp.err
		}
	}
	return nil
}

// segmentParts is where the order's stock comes from, as recorded.
func (r *commitReq) segmentParts() []segments.Part {
	parts := make([]segments.Part, 0, len(r.parts))
	for _, p := range r.parts {
		parts = append(parts, segments.Part{Place: p.st.place, Qty: p.qty})
	}
	return parts
}

// planBatch works out each place's new counter, in the order the places
// first appear. A place whose cache is stale is read first; one whose lock
// is gone is marked lost, one that holds less than the batch takes there
// (which reservations prevent unless etcd changed under us) short.
func (c *Coordinator) planBatch(ctx context.Context, batch []*commitReq) (map[*placeState]*batchPlace, []*batchPlace) {
	places := map[*placeState]*batchPlace{}
	var order []*batchPlace
	for _, cr := range batch {
		for _, p := range cr.parts {
			bp := places[p.st]
			if bp == nil {
				bp = &batchPlace{st: p.st, q: p.q, own: p.own}
				places[p.st] = bp
				order = append(order, bp)
			}
			if bp.own != p.own {
				bp.lost = true // two keys for one place: the older one is gone
			}
			bp.take += p.qty
			bp.n++
		}
	}
	for _, bp := range order {
		if bp.lost || bp.own.ctx.Err() != nil {
			bp.lost = true
			continue
		}
		if err := bp.st.ensure(ctx, c, bp.own); err != nil {
			if errors.Is(err, ErrLockLost) {
				bp.lost = true
			} else {
				bp.err = err
			}
			continue
		}
		st := bp.st
		st.mu.Lock()
		if st.token != bp.own.rev {
			bp.lost = true
		}
		bp.modRev = st.modRev
		switch {
		case st.value >= bp.take:
			bp.value = st.value - bp.take
		case st.inKnown && st.value+st.inbox >= bp.take:
			bp.absorb, bp.inMod = true, st.inMod
			bp.value = st.value + st.inbox - bp.take
		default:
			bp.shortage = true
		}
		st.mu.Unlock()
	}
	return places, order
}

// diagnose reads a failed batch's Else branch: it answers the requests
// whose place's lock is gone or whose order ID was used, refreshes the
// caches, and returns the requests to send again.
func (c *Coordinator) diagnose(ctx context.Context, batch []*commitReq, order []*batchPlace, rs []*pb.ResponseOp) []*commitReq {
	i := 0
	next := func() []*mvccpb.KeyValue { r := rs[i]; i++; return r.GetResponseRange().GetKvs() }
	lost := map[*placeState]bool{}
	for _, bp := range order {
		lockKV, counterKV := next(), next()
		var inKV []*mvccpb.KeyValue
		if bp.st.inKey != "" {
			inKV = next()
		}
		if len(lockKV) == 0 || lockKV[0].CreateRevision != bp.own.rev {
			lost[bp.st] = true
			bp.q.lose(bp.own, ErrLockLost)
			continue
		}
		st := bp.st
		value, mod, err := decodeCounterKV(st.key, &pb.RangeResponse{Kvs: counterKV})
		in, inMod, inErr := int64(0), int64(0), error(nil)
		if st.inKey != "" {
			in, inMod, inErr = decodeCounterKV(st.inKey, &pb.RangeResponse{Kvs: inKV})
		}
		st.mu.Lock()
		if st.token == bp.own.rev {
			if err != nil || inErr != nil {
				st.stale = true
			} else {
				st.value, st.modRev = value, mod
				if st.inKey != "" {
					st.seeInboxLocked(in, inMod)
				}
			}
		}
		st.mu.Unlock()
	}
	rest := batch[:0:0]
	for _, cr := range batch {
		idx := next()
		switch {
		case len(idx) > 0:
			cr.finish(result(c.replay(ctx, cr.req, idx[0])))
		default:
			isLost := false
			for _, p := range cr.parts {
				isLost = isLost || lost[p.st]
			}
			if isLost {
				cr.finish(failed(ErrLockLost))
			} else {
				rest = append(rest, cr)
			}
		}
	}
	return rest
}

// commitOutcome labels a group commit's round trip for the metrics.
func commitOutcome(resp *clientv3.TxnResponse, err error) string {
	switch {
	case err != nil:
		return "error"
	case resp.Succeeded:
		return "committed"
	}
	return "refused"
}
