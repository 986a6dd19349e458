package segments

import (
	"context"
	"fmt"
	"slices"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/batch"
	"github.com/stockctl/stockctl/internal/lock"
)

// The committer is how an order's deduction reaches etcd. An order reserves
// its units on the place(s) it takes from (placeState.reserve, or
// reserveDirect), and hands a commitReq to a committer. The committer sends
// every request waiting at that moment, of every place and SKU of this
// process, in one transaction (commitParallel at once when they share
// nothing): for each place its fence and its writes, for each order a
// compare that its ID is unused and its record (which is the ID's claim),
// for each SKU a compare of its incarnation, for each buyer its counter.
// Under load an order costs a fraction of one etcd write, and a place's
// next order runs while the previous one's commit is in flight (its
// reservation keeps the successor from planning with those units).
//
// Every place of a transaction carries its fence: what proves, inside the
// transaction, that this process may still write it.
//   - lockFence, a held place (the orders' step ran under its lock): the
//     lock key is this process's (its CreateRevision is the hold's), and
//     the counter is at the revision last committed; the counter is
//     written with every commit.
//   - counterFence, a direct place (sell.go's tryDirect: a segment sold without its
//     lock): the counter is at the ModRevision this process last wrote or
//     read, and, unless this process owns it for lazy sales, the lock's
//     range is empty. A lazy place's counter is written only when a settle
//     is due; otherwise an order costs its record alone.
//
// In a batch with direct places, orders that share no key (no place, no
// buyer) are nested transactions of that one transaction (txnGroup): a
// compare lost on one place fails only the orders of its group.
//
// A refused transaction is never a silent failure: its Else branch reads
// what the fences and orders compared, and the committer answers the
// orders whose place was lost (lock.ErrLost), taken by another process
// (resShort: they climb the ladder), whose SKU was deleted or replaced, or
// whose ID was already used (a replay), refreshes its caches, and sends
// the rest again while their callers wait, up to maxCommitAttempts.

// fence says how a place of a commit proves that this process may still
// write it (see above).
type fence uint8

const (
	lockFence fence = iota
	counterFence
)

// committer is one queue of orders and the group commits that send them.
// An engine has two, with the same code: held orders and direct orders, so
// that neither kind waits behind the other's transactions.
type committer struct {
	e        *Engine
	cost     opCost // what one place costs a transaction (selectOrders)
	batcher  batch.Batcher[*commitReq]
	inflight inflight // what this committer's transactions in flight hold
}

func newCommitter(e *Engine, cost opCost) *committer {
	c := &committer{e: e, cost: cost}
	c.batcher = batch.Batcher[*commitReq]{Parallel: commitParallel, SpillOnly: true, Spill: c.inflight.spills, Go: e.bg.Go, Select: c.selectBatch, Commit: c.commit,
		Fail: func(cr *commitReq) { cr.finish(failed(lock.ErrClosed)) }}
	return c
}

// submit hands parts of req to the committer; the caller waits on the
// returned request.
func (c *committer) submit(ctx context.Context, req *allocReq, parts []commitPart) *commitReq {
	cr := &commitReq{req: req, parts: parts, ctx: ctx, done: make(chan struct{})}
	c.batcher.Submit(cr)
	return cr
}

// selectBatch is the batcher's Select: the oldest requests that fit one
// transaction and share nothing with the transactions in flight.
func (c *committer) selectBatch(queue []*commitReq) (batch, rest []*commitReq) {
	return c.inflight.take(queue, c.e.cfg.MaxTxnOps, c.cost)
}

// commit commits batch, or answers each request of it (the batcher's
// Commit).
func (c *committer) commit(bg context.Context, batch []*commitReq) {
	defer c.inflight.unmark(slices.Clone(batch))
	for len(batch) > 0 {
		batch = c.commitGroup(bg, batch)
	}
}

// commitGroup commits batch within the commit timeout, or answers each
// request of it, except those it defers: when a transaction failed only
// because another process changed a buyer's counter meanwhile, the
// requests of that buyer are returned to be sent after the others, so that
// one buyer ordering hard from several processes at once does not make
// everyone's commit fail.
func (c *committer) commitGroup(bg context.Context, batch []*commitReq) (deferred []*commitReq) {
	ctx, cancel := context.WithTimeout(bg, c.e.cfg.CommitTimeout)
	defer cancel()
	for len(batch) > 0 {
		var later []*commitReq
		batch, later = c.commitOnce(ctx, batch)
		deferred = append(deferred, later...)
	}
	return deferred
}

// commitOnce plans batch and sends it in one transaction, answering every
// request it can; it returns the requests to plan and send again, and
// those to send after the others (commitGroup).
func (c *committer) commitOnce(ctx context.Context, batch []*commitReq) (again, deferred []*commitReq) {
	e := c.e
	if err := ctx.Err(); err != nil {
		// The commit timeout passed while planning (etcd slow or
		// unreachable): nothing of these was committed.
		for _, cr := range batch {
			cr.finish(failed(fmt.Errorf("commit did not get through within %v, nothing deducted: %w", e.cfg.CommitTimeout, err)))
		}
		return nil, nil
	}
	users, batch := e.planUsers(ctx, batch)
	if len(batch) == 0 {
		return nil, nil
	}
	if e.cfg.LazySegments && c == e.direct {
		// Direct orders only (the held committer has none), after the
		// buyers' limits: an order refused there writes nothing.
		if rest, taken := e.takeDirects(ctx, batch); !taken {
			e.settleUsers(users, 0, nil)
			return rest, nil
		}
	}
	places, order := e.planPlaces(ctx, batch)
	if keep := answerUnplannable(batch, places); len(keep) != len(batch) {
		// What the plan takes from its places and adds to its buyers
		// included the requests answered: plan again.
		return keep, nil
	}
	if absorbs := needAbsorb(order); len(absorbs) > 0 {
		// A held place's inbox is absorbed in a transaction of its own,
		// so that a release or a refill landing in it meanwhile fails only
		// that, never the batch; then the batch is planned again.
		e.absorb(ctx, absorbs)
		return batch, nil
	}

	groups := e.txnGroups(batch, order, users)
	if len(batch) > 1 && !fitsOneTxn(groups, e.cfg.MaxTxnOps) {
		// The places cost more than selectOrders was told (a lean
		// place's cache changed after its order reserved there): half
		// of the batch is planned again now, the rest sent after it.
		half := len(batch) / 2
		return batch[:half], batch[half:]
	}
	rev, results, err := e.sendGroups(ctx, groups)
	if err != nil {
		// The outcome is unknown: the callers retry under the same IDs to
		// learn it, and the places are read again before their next use.
		for _, pp := range order {
			pp.unknown()
		}
		e.settleUsers(users, 0, nil)
		for _, cr := range batch {
			cr.finish(failed(err))
		}
		return nil, nil
	}
	var held []*placePlan
	var hot map[string]bool // buyers whose counters moved: made only on a refusal
	for i, g := range groups {
		r := results[i]
		if r.Succeeded {
			g.committed(e, rev)
			continue
		}
		if r.Responses == nil {
			// Refused, and what refused it could not be read
			// (sendGroups): nothing was written; its places are read
			// afresh and its orders sent again.
			for _, pp := range g.order {
				pp.unknown()
			}
			e.settleUsers(g.users, 0, nil)
			again = append(again, answerUnplannable(g.batch, places)...)
			continue
		}
		// Refused: read what changed, in the order the Else branch was
		// built (build): the places, the orders' records, the SKUs, the
		// buyers.
		tail := r.Responses[len(r.Responses)-len(g.users):]
		e.settleUsers(g.users, 0, tail)
		a, h := e.answerRefused(ctx, g.batch, places, g.order, r.Responses, g.gone)
		again, held = append(again, a...), append(held, h...)
		for k := range changedUsers(g.users, tail) {
			if hot == nil {
				hot = map[string]bool{}
			}
			hot[k] = true
		}
	}
	// The held places' counters and inboxes may have moved under the
	// plan (a direct place's were read in the Else branch).
	e.refreshPlaces(ctx, held)
	if len(hot) > 0 {
		var cool, later []*commitReq
		for _, cr := range again {
			if hot[cr.req.userKey] {
				later = append(later, cr)
			} else {
				cool = append(cool, cr)
			}
		}
		if len(cool) > 0 && len(later) > 0 {
			again, deferred = cool, later
		}
	}
	return again, deferred
}

// answerRefused reads a refused transaction's Else branch rs (built by
// txn and build: the places' reads, then each order's record) and
// answers every request it can: a replay when the order's record exists;
// the SKU's error when it was deleted or replaced (gone); lock.ErrLost on a
// held place whose lock is gone; resShort (raced) on a direct place another
// process took. It returns the requests to send again, and the held places
// still held, whose counters and inboxes the caller reads again (the plan
// may have been made on a cache that moved).
func (e *Engine) answerRefused(ctx context.Context, batch []*commitReq, places map[*placeState]*placePlan, order []*placePlan, rs []*pb.ResponseOp, gone map[*skuInfo]error) (again []*commitReq, held []*placePlan) {
	next := 0
	for _, pp := range order {
		next += pp.readElse(rs[next:])
		if pp.fence == lockFence && !pp.lost {
			held = append(held, pp)
		}
	}
	for _, cr := range batch {
		record := rs[next].GetResponseRange().GetKvs()
		next++
		switch {
		case len(record) > 0:
			cr.finish(result(e.replay(ctx, cr.req, record[0])))
		case gone[cr.req.sku] != nil:
			cr.finish(failed(gone[cr.req.sku]))
		case cr.touches(places, func(pp *placePlan) bool { return pp.lost }):
			cr.finish(failed(lock.ErrLost))
		case cr.touches(places, func(pp *placePlan) bool { return pp.raced }):
			// Another process sells there (or took the lock): this one
			// moves elsewhere rather than race it again.
			cr.finish(placeResult{kind: resShort, raced: true})
		default:
			again = append(again, cr)
		}
	}
	return again, held
}

// answerUnplannable answers the requests of batch that cannot be committed
// as planned: a place lost, unreadable or short (a held place holding less
// than its reservations: changed under the lock; a direct place: the order
// climbs the ladder), or refused by compares too often or past its
// caller's ctx. It returns the others, counting their attempt.
func answerUnplannable(batch []*commitReq, places map[*placeState]*placePlan) (keep []*commitReq) {
	keep = batch[:0:0]
	for _, cr := range batch {
		var why string
		switch {
		case cr.touches(places, func(pp *placePlan) bool { return pp.lost }):
			cr.finish(failed(lock.ErrLost))
		case cr.touches(places, func(pp *placePlan) bool { return pp.err != nil }):
			cr.finish(failed(cr.placeErr(places)))
		case cr.touches(places, func(pp *placePlan) bool { why = pp.shortHeld; return why != "" }):
			// A held place short (planHeld says why).
			cr.finish(failed(fmt.Errorf("stock changed under the lock after the business step (%s); nothing deducted: %w", why, ErrContention)))
		case cr.touches(places, func(pp *placePlan) bool { return pp.short }):
			cr.finish(placeResult{kind: resShort})
		case cr.ctx.Err() != nil:
			cr.finish(failed(fmt.Errorf("%w (its commit was refused by a compare and not sent again: nothing deducted)", context.Cause(cr.ctx))))
		case cr.attempts >= maxCommitAttempts:
			cr.finish(failed(fmt.Errorf("%d commits refused by compares, nothing deducted: %w", cr.attempts, ErrContention)))
		default:
			cr.attempts++
			keep = append(keep, cr)
		}
	}
	return keep
}

// A txnGroup is a part of a batch that commits or is refused on its own:
// its places, orders and buyers share no key with another group's (an
// order taking from two places joins them; so do two orders of one buyer,
// who has one counter). A batch of several groups is sent as one
// transaction of nested ones, one per group (etcd evaluates each nested
// transaction's compares on its own, all at one revision), so that a race
// lost on one place, typically another process's direct commit on a
// segment this one sells directly too, fails only the orders there and
// never the batch: the others are served in the same round trip.
type txnGroup struct {
	batch []*commitReq
	order []*placePlan
	users []*batchUser

	// Built by build: the transaction's compares and writes; each order's
	// parts as recorded; the SKUs compared, whose meta reads start at
	// metaAt in the group's Else reads (elseReads).
	cmps    []clientv3.Cmp
	ops     []clientv3.Op
	partsOf [][]Part
	skus    []*skuInfo
	metaAt  int

	// gone are the SKUs a refused group found deleted or replaced
	// (forgotten: their orders are answered with the error).
	gone map[*skuInfo]error
}

// txnGroups splits a planned batch into groups that share no key (see
// txnGroup), built, in the order their first requests appear. It returns
// one group of the whole batch when the batch has one, when it has no
// direct place, or when nesting would not fit the server's max-txn-ops
// (etcd counts an outer transaction's ops and lowers each nested one's
// limit by them). Only a direct place's compare is lost to other
// processes in the normal course of a sale; a held place's fails when its
// lock is gone, rarely. A batch of held places gains nothing from nesting,
// which costs etcd a check and an apply per group, so it is sent flat, as
// before nesting (no difference was measurable either way: three pairs of
// the lock bench's held-only batches, docs/benchmarks.md).
func (e *Engine) txnGroups(batch []*commitReq, order []*placePlan, users []*batchUser) []*txnGroup {
	whole := func() []*txnGroup {
		g := &txnGroup{batch: batch, order: order, users: users}
		e.build(g)
		return []*txnGroup{g}
	}
	if !slices.ContainsFunc(order, func(pp *placePlan) bool { return pp.fence == counterFence }) {
		return whole()
	}
	// Union the requests that share a place or a buyer.
	parent := make([]int, len(batch))
	find := func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	union := func(a, b int) {
		if ra, rb := find(a), find(b); ra != rb {
			parent[max(ra, rb)] = min(ra, rb)
		}
	}
	placeAt := map[*placeState]int{}
	userAt := map[string]int{}
	for i, cr := range batch {
		parent[i] = i
		for _, p := range cr.parts {
			if j, ok := placeAt[p.st]; ok {
				union(i, j)
			} else {
				placeAt[p.st] = i
			}
		}
		if k := cr.req.userKey; k != "" {
			if j, ok := userAt[k]; ok {
				union(i, j)
			} else {
				userAt[k] = i
			}
		}
	}
	byRoot := map[int]*txnGroup{}
	var groups []*txnGroup
	for i, cr := range batch {
		r := find(i)
		g := byRoot[r]
		if g == nil {
			g = &txnGroup{}
			byRoot[r] = g
			groups = append(groups, g)
		}
		g.batch = append(g.batch, cr)
	}
	if len(groups) == 1 {
		return whole()
	}
	for _, pp := range order {
		g := byRoot[find(placeAt[pp.st])]
		g.order = append(g.order, pp)
	}
	for _, bu := range users {
		g := byRoot[find(userAt[bu.key])]
		g.users = append(g.users, bu)
	}
	limit := e.cfg.MaxTxnOps - len(groups)
	for _, g := range groups {
		e.build(g)
		if max(len(g.cmps), len(g.ops)) > limit {
			return whole()
		}
	}
	return groups
}

// build makes g's transaction: its places' compares and puts
// (placePlan.txn), then what every batch of orders carries after them:
// each order's absence compare and record put, each SKU's incarnation
// compare, then the buyers' counters last. The slices are sized once:
// a commit carries tens of orders, and growing them was the largest
// allocation of the commit path (BenchmarkBuild).
func (e *Engine) build(g *txnGroup) {
	// A place adds up to 3 compares and 2 writes (placePlan.txn), an
	// order 1 of each (2 writes for a reservation), a buyer 1 of each.
	n := len(g.batch) + len(g.users)
	reservations := 0
	for _, cr := range g.batch {
		if cr.req.ttl > 0 {
			reservations++
		}
	}
	seen := map[*skuInfo]bool{}
	for _, cr := range g.batch {
		if !seen[cr.req.sku] && cr.req.sku.created != 0 {
			seen[cr.req.sku] = true
			g.skus = append(g.skus, cr.req.sku)
		}
	}
	cmps := make([]clientv3.Cmp, 0, 3*len(g.order)+n+len(g.skus))
	ops := make([]clientv3.Op, 0, 2*len(g.order)+n+reservations)
	for _, pp := range g.order {
		cmps, ops = pp.txn(cmps, ops)
	}
	g.partsOf = make([][]Part, len(g.batch))
	for i, cr := range g.batch {
		g.partsOf[i] = cr.segmentParts()
		key := e.orderKey(cr.req)
		cmps = append(cmps, recordAbsent(key))
		ops = e.appendOrderPuts(ops, key, cr.req, g.partsOf[i])
	}
	for _, info := range g.skus {
		if !g.fencesIncarnation(info) {
			cmps = append(cmps, e.incarnation(info)...)
		}
	}
	g.cmps, g.ops = appendUserCmpsOps(cmps, ops, g.users)
}

// fencesIncarnation reports whether g's counter compares alone fence SKU
// info against being deleted or created again since info was read, so
// that its incarnation's compare (a range read in etcd, a third of a
// direct order's compares over many SKUs) can be left out: every order of
// info in g sells only from direct places whose counters g compares at a
// ModRevision seen while info's incarnation was current
// (directState.verified). Deleting a SKU deletes its counters in the same
// transaction as its meta record, and creating it writes them anew, so a
// counter still at that ModRevision proves the incarnation unchanged. A
// held place (its cache filled under a lock, unchecked against the meta
// record) or an unverified direct cache (a peek's) keeps the compare.
func (g *txnGroup) fencesIncarnation(info *skuInfo) bool {
	if info.created == 0 {
		return false
	}
	fenced := false
	for _, cr := range g.batch {
		if cr.req.sku != info {
			continue
		}
		for _, p := range cr.parts {
			i := slices.IndexFunc(g.order, func(pp *placePlan) bool { return pp.st == p.st })
			if i < 0 {
				return false
			}
			if pp := g.order[i]; pp.fence != counterFence || pp.mod <= 0 || pp.verified != info.created {
				return false
			}
			fenced = true
		}
	}
	return fenced
}

// elseReads appends to diag the reads that tell what refused g's
// transaction, at rev, in the order answerRefused and commitOnce read
// them: the places' (placePlan.elseReads), each order's record, each SKU's
// meta record (g.metaAt from the first of g's reads), the buyers'
// counters. They are not sent with the transaction (sendGroups).
func (e *Engine) elseReads(g *txnGroup, diag []clientv3.Op, rev int64) []clientv3.Op {
	at := clientv3.WithRev(rev)
	diag = slices.Grow(diag, 3*len(g.order)+len(g.batch)+len(g.skus)+len(g.users))
	base := len(diag)
	for _, pp := range g.order {
		diag = pp.elseReads(diag, rev)
	}
	for _, cr := range g.batch {
		diag = append(diag, clientv3.OpGet(e.orderKey(cr.req), at))
	}
	g.metaAt = len(diag) - base
	for _, info := range g.skus {
		diag = append(diag, clientv3.OpGet(e.keys.Meta(info.name), clientv3.WithKeysOnly(), at))
	}
	for _, bu := range g.users {
		diag = append(diag, clientv3.OpGet(bu.key, at))
	}
	return diag
}

// fitsOneTxn reports whether groups, sent flat as one transaction, stay
// within etcd's --max-txn-ops (limit): compares and puts each. Groups that
// do also fit sent nested (txnGroups sends them whole otherwise).
func fitsOneTxn(groups []*txnGroup, limit int) bool {
	var cmps, ops int
	for _, g := range groups {
		cmps, ops = cmps+len(g.cmps), ops+len(g.ops)
	}
	return cmps <= limit && ops <= limit
}

// sendGroups sends groups in one transaction: flat when there is one or
// when no commit of several was refused lately (nestAfterRefusal), else
// one nested transaction per group. It returns the revision of the
// answer and each group's outcome; a refused group's gone are filled in
// (the SKUs found deleted or replaced, forgotten).
//
// A group's Else reads are not sent with it: every transaction would carry
// them, built, marshalled, parsed by etcd and logged in its raft log and
// WAL, for the few refused by a compare (0.02 % of groups selling 1,000
// SKUs lazily). A refused group's are read afterwards at the answer's
// revision (readRefused), which shows what its Else branch would have:
// no group writes another's keys. A refused group whose reads failed is
// answered with nil Responses (commitOnce sends its orders again, its
// places read afresh).
func (e *Engine) sendGroups(ctx context.Context, groups []*txnGroup) (rev int64, results []*pb.TxnResponse, err error) {
	n := 0
	for _, g := range groups {
		n += len(g.batch)
	}
	sent := time.Now()
	var resp *clientv3.TxnResponse
	switch {
	case len(groups) == 1:
		g := groups[0]
		resp, err = e.kv.Txn(ctx).If(g.cmps...).Then(g.ops...).Commit()
		if err == nil {
			results = []*pb.TxnResponse{(*pb.TxnResponse)(resp)}
		}
	case sent.UnixNano() >= e.nestUntil.Load():
		// No group refused lately: the groups go flat, as one, which
		// etcd applies for less than the same groups nested (over 1,000
		// SKUs a group is about an order, and a nested transaction each
		// cost 1.2x the orders/s: docs/benchmarks.md, stop 46). One refused
		// compare refuses them all, and nothing was applied: they go again
		// nested, for each group's own outcome, and stay nested a while.
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		for _, g := range groups {
			cmps, ops = append(cmps, g.cmps...), append(ops, g.ops...)
		}
		resp, err = e.kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err == nil && resp.Succeeded {
			next := 0
			for _, g := range groups {
				results = append(results, &pb.TxnResponse{Header: resp.Header, Succeeded: true, Responses: resp.Responses[next : next+len(g.ops)]})
				next += len(g.ops)
			}
			break
		}
		if err == nil {
			e.nestUntil.Store(time.Now().Add(nestAfterRefusal).UnixNano())
			resp, results, err = e.sendNested(ctx, groups)
		}
	default:
		resp, results, err = e.sendNested(ctx, groups)
	}
	if err != nil {
		e.metrics.committed(n, time.Since(sent), "error")
		return 0, nil, err
	}
	rev = resp.Header.Revision
	var refused []int
	for i := range groups {
		if !results[i].Succeeded {
			refused = append(refused, i)
		}
	}
	e.readRefused(ctx, rev, groups, results, refused)
	var gone map[*skuInfo]error // made on the first SKU found gone (rare)
	for _, i := range refused {
		g, r := groups[i], results[i]
		if r.Responses == nil {
			continue
		}
		for j, info := range g.skus {
			if err, ok := gone[info]; ok {
				g.setGone(info, err)
				continue
			}
			kvs := r.Responses[g.metaAt+j].GetResponseRange().GetKvs()
			if len(kvs) == 1 && kvs[0].CreateRevision == info.created {
				continue
			}
			e.forgetSKU(info)
			if gone == nil {
				gone = map[*skuInfo]error{}
			}
			gone[info] = skuGoneErr(info, len(kvs) == 0)
			g.setGone(info, gone[info])
		}
	}
	outcome := "committed"
	switch len(refused) {
	case 0:
	case len(groups):
		outcome = "refused"
	default:
		outcome = "partial"
	}
	e.metrics.committed(n, time.Since(sent), outcome)
	return rev, results, nil
}

// nestAfterRefusal is how long a refused commit of several groups keeps
// the engine's commits nested (sendGroups): where commits race, a flat one
// refused would cost every group of it a second round trip.
const nestAfterRefusal = time.Second

// sendNested sends groups as one transaction of nested ones, a group each,
// and returns each group's answer.
func (e *Engine) sendNested(ctx context.Context, groups []*txnGroup) (*clientv3.TxnResponse, []*pb.TxnResponse, error) {
	nested := make([]clientv3.Op, len(groups))
	for i, g := range groups {
		nested[i] = clientv3.OpTxn(g.cmps, g.ops, nil)
	}
	resp, err := e.kv.Txn(ctx).Then(nested...).Commit()
	if err != nil {
		return nil, nil, err
	}
	results := make([]*pb.TxnResponse, 0, len(groups))
	for _, r := range resp.Responses {
		results = append(results, r.GetResponseTxn())
	}
	return resp, results, nil
}

// readRefused reads the Else reads of the groups refused (their indexes)
// at rev into their results' Responses, in read-only transactions of at
// most max-txn-ops reads: every read is at rev, so a group's reads may
// span two of them and still show one moment. A result any of whose reads
// failed keeps nil Responses.
func (e *Engine) readRefused(ctx context.Context, rev int64, groups []*txnGroup, results []*pb.TxnResponse, refused []int) {
	var ops []clientv3.Op
	ends := make([]int, len(refused)) // where each group's reads end in ops
	for k, i := range refused {
		ops = e.elseReads(groups[i], ops, rev)
		ends[k] = len(ops)
	}
	got := make([]*pb.ResponseOp, 0, len(ops))
	for start := 0; start < len(ops); {
		chunk := ops[start:min(len(ops), start+max(1, e.cfg.MaxTxnOps))]
		resp, err := e.kv.Txn(ctx).Then(chunk...).Commit()
		if err != nil || len(resp.Responses) != len(chunk) {
			if ctx.Err() == nil {
				e.log.Warn("could not read what refused a commit; its orders are sent again on fresh reads", "revision", rev, "err", err)
			}
			break
		}
		got = append(got, resp.Responses...)
		start += len(chunk)
	}
	begin := 0
	for k, i := range refused {
		if ends[k] > len(got) {
			break
		}
		results[i].Responses = got[begin:ends[k]]
		begin = ends[k]
	}
}

func (g *txnGroup) setGone(info *skuInfo, err error) {
	if g.gone == nil {
		g.gone = map[*skuInfo]error{}
	}
	g.gone[info] = err
}

// committed records a group committed at rev: its places' caches, its
// buyers' counters, and each order's allocation.
func (g *txnGroup) committed(e *Engine, rev int64) {
	for _, pp := range g.order {
		if pp.fence != lockFence && pp.settle && pp.written.Owner != 0 {
			e.ownLazily(pp.st.sku) // a claim, or a settle that keeps the place (adoptDirect)
		}
		pp.committed(rev)
	}
	e.settleUsers(g.users, rev, nil)
	for i, cr := range g.batch {
		for _, p := range cr.parts {
			if !p.direct {
				p.q.Unpin(p.own)
			}
		}
		cr.resolve(served(e.allocation(cr.req, g.partsOf[i], rev)))
	}
}

// commitPart is the units an order takes from one place, reserved under
// the lock key own of the place's queue q (and pinned there: a tenure is not
// released while the commit is pending).
//
// A direct part (tryDirect) holds no lock: its place is a segment this
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
	// lean: a direct part whose place this process sold lazily, seen
	// under the SKU's incarnation, and whose counter held the part beside
	// every reservation made there before it (reserveDirect): the batch
	// is expected to pay leanPlaceCost there, and no compare of the SKU.
	lean bool
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
