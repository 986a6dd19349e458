package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/segments"
)

// Placement of SKUs over a fleet's clusters. docs/clusters.md states the
// protocol and its proof; in short:
//
//   - the registry (the fleet's first cluster) holds each SKU's claim,
//     placement/<sku> = {cluster, state}, written once by the first
//     creation (create-if-absent, and only if the registry holds no SKU of
//     that name from before the fleet);
//   - the SKU's cluster holds its pin, pin/<sku> = "<generation> live|dead",
//     the generation being the claim's revision in the registry; the
//     creation's first transaction (the meta record) compares the pin as
//     this creation wrote or read it;
//   - a delete forgets the placement in three steps: mark the claim
//     forgetting (revision f), kill the pin with generation f in the SKU's
//     cluster if it holds no meta record, delete the claim if unchanged.
//     A creation that read the claim before the mark holds a generation
//     below f: its pin write is refused and its fenced meta write fails.
//
// Lookups read every cluster at once and take the first cluster that holds
// the SKU's meta record; the rest of the answers are still checked, and a
// SKU found in two clusters (which the protocol never makes, but a
// misconfiguration could) is refused from then on, naming both.

// lookupTimeout bounds the reads of a lookup that go on after its caller
// has its answer (checking that no other cluster holds the SKU).
const lookupTimeout = 30 * time.Second

// decisionGrace bounds how long a lookup whose caller's ctx ended waits,
// once every cluster has answered, for the decision made from the answers.
const decisionGrace = time.Second

// claim is a SKU's placement claim in the registry.
type claim struct {
	Cluster    string `json:"cluster"`
	Forgetting bool   `json:"forgetting,omitempty"`
}

// pin is the value of a SKU's pin in its cluster.
type pin struct {
	gen  int64
	dead bool
}

func (p pin) encode() string {
	state := "live"
	if p.dead {
		state = "dead"
	}
	return fmt.Sprintf("%020d %s", p.gen, state)
}

func decodePin(key string, b []byte) (pin, error) {
	gen, state, ok := strings.Cut(string(b), " ")
	n, err := strconv.ParseInt(gen, 10, 64)
	if !ok || err != nil || (state != "live" && state != "dead") {
		return pin{}, fmt.Errorf("%w: pin %s: %q", ErrCorrupt, key, b)
	}
	return pin{gen: n, dead: state == "dead"}, nil
}

// mix64 is splitmix64's finaliser. FNV-1a of two strings that differ only
// in one byte differ mostly in low bits: compared raw, one cluster name
// would win nearly every key.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// rendezvous picks, of names, the one with the highest hash of (name,
// key): a stable choice that moves only the keys a new name wins.
func rendezvous(names []string, key string) string {
	best, bestScore := "", uint64(0)
	for _, n := range names {
		h := fnv.New64a()
		h.Write([]byte(n))
		h.Write([]byte{0})
		h.Write([]byte(key))
		if s := mix64(h.Sum64()); best == "" || s > bestScore {
			best, bestScore = n, s
		}
	}
	return best
}

// route returns the member that serves sku: from the cache (cached true),
// or by a lookup. A SKU found nowhere is served by the cluster its claim
// names, else by the registry, whose answer is then ErrUnknownSKU.
func (f *fleet) route(ctx context.Context, sku string) (*member, bool, error) {
	f.mu.Lock()
	msg, split := f.splitAt[sku]
	m := f.placed[sku]
	f.mu.Unlock()
	if split {
		return nil, false, fmt.Errorf("%s: %w: %s", sku, ErrConflict, msg)
	}
	if m != nil {
		return m, true, nil
	}
	m, err := f.locate(ctx, sku)
	return m, false, err
}

// forget drops sku's cached placement if it is m.
func (f *fleet) forget(sku string, m *member) {
	f.mu.Lock()
	if f.placed[sku] == m {
		delete(f.placed, sku)
	}
	f.mu.Unlock()
}

// forgetAny drops sku's cached placement, whichever cluster it names.
func (f *fleet) forgetAny(sku string) {
	f.mu.Lock()
	delete(f.placed, sku)
	f.mu.Unlock()
}

// answer is one cluster's answer to a lookup.
type answer struct {
	m     *member
	has   bool   // it holds sku's meta record
	rev   int64  // the meta record's create revision
	claim *claim // the registry's claim of sku, if any
	err   error
}

// locate finds sku's cluster by reading every cluster at once (see the
// top of this file).
func (f *fleet) locate(ctx context.Context, sku string) (*member, error) {
	qctx, cancel := context.WithTimeout(f.ctx, lookupTimeout)
	// The reads run on the fleet's context (others may wait for the same
	// lookup), but a cluster that is down must be answered within the
	// caller's time: its connect wait is the caller's.
	wait := connectWaitFor(ctx)
	answers := make(chan answer, len(f.members))
	for i, m := range f.members {
		go func() {
			a := answer{m: m}
			defer func() { answers <- a }()
			// A cluster whose connection is down answers within
			// connectWait (or half the caller's time), not lookupTimeout.
			if a.err = m.connectedWithin(qctx, wait); a.err != nil {
				return
			}
			if a.err = f.ready(qctx, m); a.err != nil {
				return
			}
			ops := []clientv3.Op{clientv3.OpGet(m.c.keys.Meta(sku))}
			if i == 0 {
				ops = append(ops, clientv3.OpGet(m.c.keys.Placement(sku)))
			}
			resp, err := m.c.kv.Txn(qctx).Then(ops...).Commit()
			if err != nil {
				a.err = m.wrap(err)
				return
			}
			if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
				a.has, a.rev = true, kvs[0].CreateRevision
			}
			if i == 0 {
				if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
					var cl claim
					if err := json.Unmarshal(kvs[0].Value, &cl); err != nil {
						a.err = fmt.Errorf("%w: placement claim of %s: %v", ErrCorrupt, sku, err)
						return
					}
					a.claim = &cl
				}
			}
		}()
	}
	type decision struct {
		m   *member
		err error
	}
	decided := make(chan decision, 1)
	var pmu sync.Mutex
	pending := map[string]bool{}
	for _, m := range f.members {
		pending[m.name] = true
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer cancel()
		var found []*member
		var reg *answer
		got := map[string]answer{}
		sent := false
		for range f.members {
			a := <-answers
			pmu.Lock()
			delete(pending, a.m.name)
			pmu.Unlock()
			got[a.m.name] = a
			if a.m == f.members[0] {
				reg = &a
			}
			if a.has {
				found = append(found, a.m)
				if !sent {
					f.mu.Lock()
					f.placed[sku] = a.m
					f.mu.Unlock()
					decided <- decision{m: a.m}
					sent = true
				}
			}
		}
		// Every cluster answered (or failed): a SKU in two clusters at
		// once is refused from then on. Two reads at different moments can
		// see a SKU deleted in one cluster and created in another, so the
		// two are read again: the same create revisions mean the same
		// records, which then existed at the same moment.
		if len(found) > 1 && f.stillBoth(qctx, sku, got[found[0].name], got[found[1].name]) {
			split := fmt.Sprintf("the SKU is in two clusters, %q and %q: stockctl refuses it until one is deleted "+
				"with a one-cluster coordinator on that cluster (see docs/clusters.md)", found[0].name, found[1].name)
			f.mu.Lock()
			f.splitAt[sku] = split
			delete(f.placed, sku)
			f.mu.Unlock()
			if !sent {
				decided <- decision{err: fmt.Errorf("%s: %w: %s", sku, ErrConflict, split)}
			}
			return
		}
		if sent {
			return
		}
		// Found nowhere.
		switch {
		case reg.err != nil:
			decided <- decision{err: &ClusterError{Cluster: reg.m.name, Unavailable: errors.Is(reg.err, ErrClusterUnavailable),
				Err: fmt.Errorf("%s is in no reachable cluster, and the registry that places it could not be read: %w", sku, reg.err)}}
		case reg.claim != nil && f.byName[reg.claim.Cluster] == nil:
			decided <- decision{err: fmt.Errorf("%s: %w: it is placed in cluster %q, which this process does not know",
				sku, ErrFleetMismatch, reg.claim.Cluster)}
		case reg.claim != nil && got[reg.claim.Cluster].err != nil:
			decided <- decision{err: got[reg.claim.Cluster].err}
		case reg.claim != nil:
			decided <- decision{m: f.byName[reg.claim.Cluster]} // its creation is not complete
		default:
			decided <- decision{m: f.members[0]} // unknown: the registry says so
		}
	}()
	select {
	case d := <-decided:
		return d.m, d.err
	case <-ctx.Done():
		// Not found in the clusters that answered: the others are named.
		var errs []error
		pmu.Lock()
		for _, m := range f.members {
			if pending[m.name] {
				errs = append(errs, &ClusterError{Cluster: m.name, Unavailable: true,
					Err: fmt.Errorf("find the cluster of %s: not in the clusters that answered, and this one did not: %w", sku, ctx.Err())})
			}
		}
		pmu.Unlock()
		if len(errs) == 0 {
			// Every cluster answered: the decision follows at once (it
			// may even have been ready as ctx ended: select picks either
			// then), and it names the cluster that failed where one did;
			// without this wait a stopped cluster's SKU could fail with a
			// bare "context deadline exceeded" (a -race run beside busy
			// loops, TestCLIClusters). Only a SKU found in two clusters
			// reads them again first: that wait is bounded.
			t := time.NewTimer(decisionGrace)
			defer t.Stop()
			select {
			case d := <-decided:
				return d.m, d.err
			case <-t.C:
			}
			return nil, fmt.Errorf("find the cluster of %s: %w", sku, ctx.Err())
		}
		return nil, errors.Join(errs...)
	}
}

// stillBoth reports whether the meta records a and b found are both still
// there, unchanged in incarnation.
func (f *fleet) stillBoth(ctx context.Context, sku string, a, b answer) bool {
	for _, x := range []answer{a, b} {
		resp, err := x.m.c.kv.Get(ctx, x.m.c.keys.Meta(sku))
		if err != nil || len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != x.rev {
			return false
		}
	}
	return true
}

// create creates sku with cfg in the named cluster ("": the one its name
// hashes to, or the one a claim already names).
func (f *fleet) create(ctx context.Context, sku, cluster string, cfg SKUConfig) (segments.Meta, error) {
	reg := f.members[0]
	if err := segments.ValidateSKU(sku); err != nil {
		return reg.c.stock.CreateSKU(ctx, sku, cfg) // its own validation error
	}
	if cluster != "" && f.byName[cluster] == nil {
		return segments.Meta{}, fmt.Errorf("create %s: cluster %q: %w: not one of %s", sku, cluster, ErrInvalidArgument,
			strings.Join(f.names, ", "))
	}
	if err := f.ready(ctx, reg); err != nil {
		return segments.Meta{}, fmt.Errorf("create %s: %w", sku, err)
	}
	target := cluster
	if target == "" {
		target = rendezvous(f.names, sku)
	}
	// (a) The claim, in the registry.
	ck := reg.c.keys.Placement(sku)
	val, _ := json.Marshal(claim{Cluster: target})
	resp, err := reg.c.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(ck), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(reg.c.keys.Meta(sku)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(reg.c.keys.Removed(target)), "=", 0)). // remove.go
		Then(clientv3.OpPut(ck, string(val))).
		Else(clientv3.OpGet(ck), clientv3.OpGet(reg.c.keys.Removed(target))).
		Commit()
	if err != nil {
		return segments.Meta{}, fmt.Errorf("create %s: claim it: %w", sku, reg.wrap(err))
	}
	gen := resp.Header.Revision
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 && len(resp.Responses[1].GetResponseRange().Kvs) > 0 {
			return segments.Meta{}, removedTarget(sku, target)
		}
		if len(kvs) == 0 {
			// The registry holds the SKU from before the fleet (no claim).
			if cluster != "" && cluster != reg.name {
				return segments.Meta{}, fmt.Errorf("create %s: %w: the SKU already exists, in cluster %q", sku, ErrConflict, reg.name)
			}
			m, err := reg.c.stock.CreateSKU(ctx, sku, cfg) // ErrConflict, or completes an interrupted creation
			return m, reg.wrap(err)
		}
		var cl claim
		if err := json.Unmarshal(kvs[0].Value, &cl); err != nil {
			return segments.Meta{}, fmt.Errorf("create %s: %w: placement claim: %v", sku, ErrCorrupt, err)
		}
		switch {
		case cl.Forgetting:
			return segments.Meta{}, fmt.Errorf("create %s: %w: it is being deleted from cluster %q: retry once the delete is done "+
				"(if no delete is running, one was interrupted: DeleteSKU completes it)", sku, ErrConflict, cl.Cluster)
		case cluster != "" && cl.Cluster != cluster:
			return segments.Meta{}, fmt.Errorf("create %s: %w: the SKU is placed in cluster %q", sku, ErrConflict, cl.Cluster)
		}
		target, gen = cl.Cluster, kvs[0].ModRevision
	}
	t := f.byName[target]
	if t == nil {
		return segments.Meta{}, fmt.Errorf("create %s: %w: it is placed in cluster %q, which this process does not know",
			sku, ErrFleetMismatch, target)
	}
	if err := f.ready(ctx, t); err != nil {
		return segments.Meta{}, fmt.Errorf("create %s: %w", sku, err)
	}
	// (b) The pin, in the SKU's cluster.
	pinRev, err := t.pin(ctx, sku, gen)
	if err != nil {
		return segments.Meta{}, fmt.Errorf("create %s: %w", sku, t.wrap(err))
	}
	// (c) The SKU, its meta record fenced by the pin.
	meta, err := t.c.stock.CreateSKU(ctx, sku, cfg, clientv3.Compare(clientv3.ModRevision(t.c.keys.Pin(sku)), "=", pinRev))
	if err != nil {
		return meta, t.wrap(err)
	}
	f.mu.Lock()
	f.placed[sku] = t
	f.mu.Unlock()
	return meta, nil
}

// pin makes sku's pin in m live with generation gen and returns its mod
// revision. A pin of a later generation, or a dead one of gen, means the
// claim read is stale: ErrConflict.
func (m *member) pin(ctx context.Context, sku string, gen int64) (int64, error) {
	key := m.c.keys.Pin(sku)
	resp, err := m.c.kv.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	want := pin{gen: gen}.encode()
	cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	if len(resp.Kvs) > 0 {
		kv := resp.Kvs[0]
		p, err := decodePin(key, kv.Value)
		if err != nil {
			return 0, err
		}
		switch {
		case p.gen > gen || p.gen == gen && p.dead:
			return 0, fmt.Errorf("%w: its placement changed meanwhile (a concurrent delete): retry", ErrConflict)
		case p.gen == gen:
			return kv.ModRevision, nil
		}
		cmp = clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)
	}
	put, err := m.c.kv.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, want)).Commit()
	if err != nil {
		return 0, err
	}
	if !put.Succeeded {
		return 0, fmt.Errorf("%w: its placement changed meanwhile: retry", ErrConflict)
	}
	return put.Header.Revision, nil
}

// unplace forgets sku's placement once its cluster holds no meta record of
// it, so that the name may be created again in any cluster. Nothing to
// forget (no claim) is not an error.
func (f *fleet) unplace(ctx context.Context, sku string) error {
	reg := f.members[0]
	if err := f.ready(ctx, reg); err != nil {
		return err
	}
	ck := reg.c.keys.Placement(sku)
	resp, err := reg.c.kv.Get(ctx, ck)
	if err != nil {
		return reg.wrap(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	var cl claim
	if err := json.Unmarshal(resp.Kvs[0].Value, &cl); err != nil {
		return fmt.Errorf("%w: placement claim of %s: %v", ErrCorrupt, sku, err)
	}
	mark := resp.Kvs[0].ModRevision
	if !cl.Forgetting {
		// (1) Mark the claim: no creation starts from it any more.
		val, _ := json.Marshal(claim{Cluster: cl.Cluster, Forgetting: true})
		r, err := reg.c.kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(ck), "=", mark)).
			Then(clientv3.OpPut(ck, string(val))).Commit()
		if err != nil {
			return reg.wrap(err)
		}
		if !r.Succeeded {
			return fmt.Errorf("%s: %w: its placement changed meanwhile: retry", sku, ErrConflict)
		}
		mark = r.Header.Revision
	}
	t := f.byName[cl.Cluster]
	if t == nil {
		return fmt.Errorf("%s: %w: it is placed in cluster %q, which this process does not know", sku, ErrFleetMismatch, cl.Cluster)
	}
	if err := f.ready(ctx, t); err != nil {
		return err
	}
	// (2) Kill the pin, if the cluster holds no SKU of the name: a creation
	// holding an older generation can neither write the pin again nor
	// commit its fenced meta record.
	r, err := t.c.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(t.c.keys.Meta(sku)), "=", 0)).
		Then(clientv3.OpPut(t.c.keys.Pin(sku), pin{gen: mark, dead: true}.encode())).Commit()
	if err != nil {
		return t.wrap(err)
	}
	if !r.Succeeded {
		// Created again meanwhile: it keeps its placement.
		val, _ := json.Marshal(claim{Cluster: cl.Cluster})
		if _, err := reg.c.kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(ck), "=", mark)).
			Then(clientv3.OpPut(ck, string(val))).Commit(); err != nil {
			return reg.wrap(err)
		}
		return fmt.Errorf("%s: %w: it was created again in cluster %q meanwhile", sku, ErrConflict, cl.Cluster)
	}
	// (3) Delete the claim.
	if _, err := reg.c.kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(ck), "=", mark)).
		Then(clientv3.OpDelete(ck)).Commit(); err != nil {
		return reg.wrap(err)
	}
	f.forget(sku, t)
	return nil
}

// freshOnce runs try on lines' placements as cached, and when it reports
// them stale (a SKU moved since it was cached: deleted, maybe created
// again in another cluster, shows as ErrUnknownSKU where it was cached, or
// as lines split over clusters), forgets every line's cached placement and
// runs it once more on fresh lookups (fresh true), whose answer stands.
// It is the one "stale cached placement: look up afresh once" of orders
// of several lines (onLines, acrossOnce).
func freshOnce[T any](f *fleet, lines []Line, try func(fresh bool) (v T, stale bool, err error)) (T, error) {
	v, stale, err := try(false)
	if !stale {
		return v, err
	}
	for _, l := range lines {
		f.forgetAny(l.SKU)
	}
	v, _, err = try(true)
	return v, err
}

// onLines runs f, an order of several lines, on the segment engine of the
// cluster that holds every line's SKU. Over several clusters, lines in two
// clusters are refused: one transaction never spans two clusters (the
// facade places such orders in two phases first: acrossOnce).
func onLines[T any](ctx context.Context, c *Coordinator, lines []segments.Line, f func(*segments.Engine) (T, error)) (T, error) {
	if c.fleet == nil || len(lines) == 0 {
		return f(c.stock)
	}
	for _, l := range lines {
		if segments.ValidateSKU(l.SKU) != nil {
			return f(c.fleet.members[0].c.stock) // its own validation error
		}
	}
	// The first try may use cached placements; a SKU moved since shows as
	// lines in two clusters or as an unknown SKU.
	return freshOnce(c.fleet, lines, func(fresh bool) (T, bool, error) {
		var zero T
		var first *member
		cached := false
		for _, l := range lines {
			m, wasCached, err := c.fleet.route(ctx, l.SKU)
			if err != nil {
				return zero, false, err
			}
			cached = cached || wasCached
			switch {
			case first == nil:
				first = m
			case m != first:
				if cached && !fresh {
					return zero, true, nil
				}
				return zero, false, fmt.Errorf("order of %d lines: %w: its SKUs are in two clusters (%s in %q, %s in %q): "+
					"an order's SKUs must share a cluster", len(lines), ErrInvalidArgument, lines[0].SKU, first.name, l.SKU, m.name)
			}
		}
		if err := first.connected(ctx); err != nil {
			return zero, false, err
		}
		v, err := f(first.c.stock)
		if cached && !fresh && errors.Is(err, ErrUnknownSKU) {
			return v, true, err
		}
		return v, false, first.wrap(err)
	})
}
