package segments

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Carts committed together. The orders of several lines of this process
// that wait at one moment share one read of their SKUs and one
// transaction (the cart batcher), as single orders share group commits
// (the read first narrowed to each line's home segment and pool counters,
// and in full when that cannot plan them all: commitCarts):
// each is judged on the shared read (a replay, a refusal true at its
// revision, read after every cart of the batch began), the ones that can
// be served from places nobody holds are planned one after the other on
// what the earlier ones leave, and all of them go in one transaction that
// compares each place, buyer counter and SKU once and each order's records'
// absence. A cart that cannot be decided so (stock in held or lazy places,
// a buyer's limit reached within the batch, a refused transaction) takes
// the path of one cart (allocateLines' loop), which reads again: a batch
// never refuses what it did not read, and never retries a batch.

// cartReq is one order of several lines handed to the cart batcher.
type cartReq struct {
	ls   []*lineReq // by SKU name
	skus []string
	n    int
	done chan struct{}
	res  *OrderAllocation
	err  error
	// alone: not decided with the batch; the caller goes on alone.
	alone bool
}

func (r *cartReq) answer(a *OrderAllocation, err error, alone bool) {
	r.res, r.err, r.alone = a, err, alone
	close(r.done)
}

// selectCarts is the cart batcher's Select: the oldest carts whose reads
// fit one transaction (readLines: at most lineMinCmps+1 Gets a line),
// stopping before an order ID already in the batch.
func (e *Engine) selectCarts(queue []*cartReq) (batch, rest []*cartReq) {
	lines := 0
	seen := map[string]bool{}
	rest = queue[:0] // the batcher expects rest at the queue's front, batch apart
	for _, r := range queue {
		id := r.ls[0].req.order
		if len(rest) > 0 || len(batch) > 0 && ((lines+len(r.ls))*(lineMinCmps+1) > e.cfg.MaxTxnOps || seen[id]) {
			rest = append(rest, r) // in order: nothing passes an earlier cart
			continue
		}
		lines += len(r.ls)
		seen[id] = true
		batch = append(batch, r)
	}
	return batch, rest
}

// freeState is a place nobody held at the batch's read, and what the
// batch has planned to take from it so far.
type freeState struct {
	inKey, lockPfx string
	cnt, cntMod    int64
	in, inMod      int64
	touched        bool // the batch takes from it
	absorbed       bool // the batch takes its inbox into the counter
}

// commitCarts is the cart batcher's Commit. It plans the batch on a read
// of the lines' home segments' and pools' counters only (readHomes), and
// when that cannot plan every cart (too little there, a record found, a buyer at the
// limit), on a full read of the SKUs (readLines), which judges and plans
// as it did before stop 48: a narrow read never answers a cart, it only
// plans, so a batch never refuses what it did not read.
func (e *Engine) commitCarts(bg context.Context, batch []*cartReq) {
	ctx, cancel := context.WithTimeout(bg, e.cfg.CommitTimeout)
	defer cancel()
	plans, places, users, ok := e.planCarts(ctx, batch, true)
	if !ok {
		plans, places, users, _ = e.planCarts(ctx, batch, false)
	}
	if len(plans) == 0 {
		return
	}
	t := &linesTxn{}
	// The places and buyers once each, with what the whole batch takes.
	for key, p := range places {
		if !p.touched {
			continue
		}
		t.cmps = append(t.cmps, clientv3.Compare(clientv3.CreateRevision(p.lockPfx), "=", 0).WithPrefix(),
			clientv3.Compare(clientv3.ModRevision(key), "=", p.cntMod))
		t.ops = append(t.ops, clientv3.OpPut(key, EncodeCounter(p.cnt)))
		if p.absorbed {
			t.cmps = append(t.cmps, clientv3.Compare(clientv3.ModRevision(p.inKey), "=", p.inMod))
			t.ops = append(t.ops, clientv3.OpPut(p.inKey, EncodeCounter(0)))
		}
	}
	for key, u := range users {
		t.cmps = append(t.cmps, clientv3.Compare(clientv3.ModRevision(key), "=", u[1]))
		t.ops = append(t.ops, clientv3.OpPut(key, EncodeCounter(u[0])))
	}
	incarnations := map[*skuInfo]bool{}
	for _, p := range plans {
		sub := &linesTxn{parts: p.parts}
		e.addRecords(sub, p.r.ls, p.r.skus, incarnations)
		t.cmps, t.ops = append(t.cmps, sub.cmps...), append(t.ops, sub.ops...)
	}
	if !t.fits(e.cfg.MaxTxnOps) {
		for _, p := range plans {
			p.r.answer(nil, nil, true)
		}
		return
	}
	resp, err := e.kv.Txn(ctx).If(t.cmps...).Then(t.ops...).Commit()
	for key := range users {
		e.users.forget(key)
	}
	switch {
	case err != nil:
		err = fmt.Errorf("%w (the order may have been committed: retry with the same order ID to learn its outcome)", err)
		for _, p := range plans {
			p.r.answer(nil, err, false)
		}
	case !resp.Succeeded:
		for _, p := range plans {
			p.r.answer(nil, nil, true)
		}
	default:
		rev := resp.Header.Revision
		for _, p := range plans {
			out := &OrderAllocation{Order: p.r.ls[0].req.order, Lines: make([]*Allocation, p.r.n), Revision: rev, Buyer: p.r.ls[0].req.buyer}
			for i, l := range p.r.ls {
				out.Lines[l.idx] = e.allocation(l.req, p.parts[i], rev)
				out.State, out.Deadline = out.Lines[l.idx].State, out.Lines[l.idx].Deadline
			}
			p.r.answer(out, nil, false)
		}
	}
}

// plannedCart is a cart of a batch and the parts of each of its lines.
type plannedCart struct {
	r     *cartReq
	parts [][]Part
}

// planCarts reads batch's lines, narrow (readHomes) or in full
// (readLines), and plans each cart on that read after the earlier ones
// (planCart). On a full read, a cart judged (a replay, ErrConflict, a
// refusal) or not plannable is answered (alone, for the latter); ok is
// true. On a narrow read nothing is answered: ok is false, and no plan
// returned, unless every cart was planned.
func (e *Engine) planCarts(ctx context.Context, batch []*cartReq, narrow bool) (plans []plannedCart, places map[string]*freeState, users map[string]*[2]int64, ok bool) {
	var all []*lineReq
	for _, r := range batch {
		all = append(all, r.ls...)
	}
	read := e.readLines
	if narrow {
		read = e.readHomes
	}
	views, err := read(ctx, all)
	if err == nil && !narrow {
		err = e.settleViews(ctx, all, views, false)
	}
	if err != nil {
		if narrow {
			return nil, nil, nil, false
		}
		for _, r := range batch {
			r.answer(nil, nil, true) // each reads again alone, and answers its own error
		}
		return nil, nil, nil, true
	}
	places = map[string]*freeState{} // by counter key
	users = map[string]*[2]int64{}   // buyer counter key → value, ModRevision
	next := 0
	for _, r := range batch {
		vs := views[next : next+len(r.ls)]
		next += len(r.ls)
		if narrow {
			for _, v := range vs {
				if v.rec != nil {
					return nil, nil, nil, false // a replay is judged on a full read
				}
			}
		} else if a, err, done := e.judgeLines(r.ls, vs, r.skus, r.n); done {
			r.answer(a, err, false)
			continue
		}
		parts, planned := e.planCart(r, vs, places, users)
		switch {
		case planned:
			plans = append(plans, plannedCart{r, parts})
		case narrow:
			return nil, nil, nil, false
		default:
			r.answer(nil, nil, true)
		}
	}
	return plans, places, users, true
}

// planCart plans r on the places nobody holds, after what the batch's
// earlier carts take (places, users: updated only when r fits whole).
func (e *Engine) planCart(r *cartReq, vs []*lineView, places map[string]*freeState, users map[string]*[2]int64) ([][]Part, bool) {
	type take struct {
		key    string
		p      *freeState
		ctr    int64
		in     int64
		absorb bool
	}
	var takes []take
	used := map[string]int64{} // what r itself takes from each place so far (ctr+in)
	parts := make([][]Part, len(r.ls))
	state := func(key string, mk func() *freeState) *freeState {
		if p := places[key]; p != nil {
			return p
		}
		p := mk()
		places[key] = p
		return p
	}
	for i, l := range r.ls {
		v, s, name := vs[i], vs[i].snap, l.req.sku.name
		left := l.req.qty
		n := len(s.segs)
		for k := 0; k < n && left > 0; k++ {
			j := (l.req.home + k) % n
			if v.locked[Segment(j)] || s.ctr[j].Lazy() || (v.narrow && j != l.req.home) {
				continue
			}
			key := e.keys.Segment(name, j)
			p := state(key, func() *freeState {
				return &freeState{inKey: e.keys.Inbox(name, j), lockPfx: e.keys.SegmentLock(name, j),
					cnt: s.cnt[j], cntMod: s.cntMod[j], in: s.inbox[j], inMod: s.inMod[j]}
			})
			have := p.cnt + p.in - used[key]
			if have <= 0 {
				continue
			}
			t := min(left, have)
			c := min(t, max(0, p.cnt-used[key]))
			takes = append(takes, take{key: key, p: p, ctr: c, in: t - c, absorb: t > c})
			used[key] += t
			parts[i] = append(parts[i], Part{Place: Segment(j), Qty: t})
			left -= t
		}
		if left > 0 && !v.locked[Pool] {
			key := e.keys.Pool(name)
			p := state(key, func() *freeState { return &freeState{lockPfx: e.keys.PoolLock(name), cnt: s.pool, cntMod: v.poolMod} })
			if have := p.cnt - used[key]; have > 0 {
				t := min(left, have)
				takes = append(takes, take{key: key, p: p, ctr: t})
				used[key] += t
				parts[i] = append(parts[i], Part{Place: Pool, Qty: t})
				left -= t
			}
		}
		if left > 0 {
			return nil, false
		}
	}
	// Buyers' limits, with the batch's earlier carts counted.
	for i, l := range r.ls {
		if l.req.userKey == "" {
			continue
		}
		u := users[l.req.userKey]
		held := vs[i].user
		if u != nil {
			held = u[0]
		}
		if held+l.req.qty > l.req.sku.perUserLimit {
			return nil, false // judged alone, on a read of its own
		}
	}
	for _, tk := range takes {
		tk.p.touched = true
		tk.p.cnt -= tk.ctr
		if tk.absorb {
			tk.p.cnt, tk.p.in, tk.p.absorbed = tk.p.cnt+tk.p.in-tk.in, 0, true
		}
	}
	for i, l := range r.ls {
		if l.req.userKey == "" {
			continue
		}
		u := users[l.req.userKey]
		if u == nil {
			u = &[2]int64{vs[i].user, vs[i].userMod}
			users[l.req.userKey] = u
		}
		u[0] += l.req.qty
	}
	return parts, true
}
