package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/segments"
)

// Removing a cluster from a fleet. docs/clusters.md states the protocol;
// in short, RemoveCluster, run by a process of the current list:
//
//  1. records the removal as begun in the registry (keys.Removed, state
//     "removing"): from then on no creation claims a SKU in that cluster
//     (a creation's claim compares that the record is absent);
//  2. reads what is still placed in the cluster: claims naming it in the
//     registry (SKUs created, being created or being deleted there), SKU
//     meta records in it, named locks and semaphores held or waited for in
//     it; any of them: the record is withdrawn and the removal refused
//     (*ClusterInUseError, naming them). A lock cluster (one named locks
//     are placed over) is refused unless MoveLocks, and then also while
//     another process holds a lease in it (with Drain, a refusal keeps
//     the record, so that the cluster empties);
//  3. writes the cluster's fleet record again, unchanged, if it holds no
//     SKU (its revision is the removal's), and reads the end of its order
//     feed from its history up to that write;
//  4. records the removal as done in the registry (state "removed", with
//     that revision and the feed's end): this is the moment the cluster
//     leaves the fleet. Fleet records are from then on read without it,
//     and a process that names it is refused;
//  5. marks the cluster's own fleet record removed;
//  6. rewrites every other cluster's fleet record without it (a process
//     started with the new list does the same for a record left behind).

// removal is the registry's record of a cluster's removal (keys.Removed).
type removal struct {
	State string `json:"state"` // removalBegun or removalDone
	// Revision is the removed cluster's revision when it was marked
	// removed (step 3); 0 while begun.
	Revision int64 `json:"revision,omitempty"`
	// FeedEnd is the revision of the last change to an order record in
	// it (ClusterRemoval.FeedEnd).
	FeedEnd int64 `json:"feedEnd,omitempty"`
}

const (
	removalBegun = "removing"
	removalDone  = "removed"
)

// withdrawWait bounds the withdrawal of a refused removal's record.
const withdrawWait = 5 * time.Second

// withoutRemoved is names without the clusters whose removal is done.
func withoutRemoved(names []string, removed map[string]removal) []string {
	if len(removed) == 0 {
		return names
	}
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return removed[n].State == removalDone })
}

// RemoveClusterOptions are RemoveCluster's options.
type RemoveClusterOptions struct {
	// MoveLocks allows removing a lock cluster (one of the clusters the
	// fleet places named locks over: the clusters it was first started
	// with). The names it held move to the other lock clusters, so every
	// process of the fleet must be stopped while it is removed (a process
	// still running with the old list would take those names in the
	// removed cluster while the others take them elsewhere), and fencing
	// tokens of those names come from another cluster's revisions from
	// then on (see ClusterRemoval.TokensMayDrop).
	MoveLocks bool
	// Drain keeps the removal begun when it is refused because the
	// cluster still holds SKUs or locks: no SKU can be created in it from
	// then on (a name that hashes to it is placed by its hash over the
	// others), so that it empties as its SKUs are deleted; run
	// RemoveCluster again once they are. A refusal without Drain withdraws
	// the removal (and so ends a drain).
	Drain bool
}

// ClusterRemoval is what RemoveCluster did.
type ClusterRemoval struct {
	// Cluster is the removed cluster.
	Cluster string
	// Revision is the removed cluster's revision when it left the fleet.
	Revision int64
	// FeedEnd is the revision of the last change to an order record in
	// the cluster (the delete of its last SKU's orders; 0 if it never had
	// one; at least its history's compacted revision): its order feed has
	// nothing after it. A consumer that has read the cluster's feed to
	// its end has a cursor at FeedEnd or later for it; a merged feed's
	// cursor below it would skip events (feed.Config.Removed).
	FeedEnd int64
	// Clusters and Locks are the fleet's clusters and lock clusters
	// without it, as every process must now be given them.
	Clusters []string
	Locks    []string
	// LockCluster says named locks were placed over it: their names moved
	// to the other lock clusters (MoveLocks).
	LockCluster bool
	// TokensMayDrop names the lock clusters whose revision was below the
	// removed cluster's: a lock name moved there may get fencing tokens
	// lower than the ones it got in the removed cluster (a store that
	// keeps the highest token it saw would refuse its new holders until
	// that cluster's revision passes Revision).
	TokensMayDrop []string
	// Unrewritten names the clusters whose fleet record could not be
	// rewritten without the removed cluster: a process started with the
	// new list rewrites it (the removal itself is done).
	Unrewritten []string
}

// ClusterInUseError is RemoveCluster's refusal of a cluster that still
// holds SKUs or locks (errors.Is(err, ErrConflict)).
type ClusterInUseError struct {
	Cluster string
	// SKUs are the SKUs placed in the cluster (a claim naming it, or a
	// meta record in it), by name; a note in parentheses says when one is
	// being created or deleted.
	SKUs []string
	// Locks are the named locks and semaphores held or waited for in it
	// ("semaphore NAME" for a semaphore).
	Locks []string
	// Draining says the removal stays begun (RemoveClusterOptions.Drain):
	// no SKU can be created in the cluster.
	Draining bool
}

func (e *ClusterInUseError) Error() string {
	var parts []string
	if len(e.SKUs) > 0 {
		parts = append(parts, fmt.Sprintf("%d SKU(s) placed in it: %s (drain and delete each, or move it: docs/deploy.md)",
			len(e.SKUs), listSome(e.SKUs)))
	}
	if len(e.Locks) > 0 {
		parts = append(parts, fmt.Sprintf("%d lock(s) held or waited for in it: %s (release them first)",
			len(e.Locks), listSome(e.Locks)))
	}
	if e.Draining {
		parts = append(parts, "draining: no SKU can be created in it from now on; run the removal again once it is empty")
	}
	return fmt.Sprintf("cluster %q cannot be removed: %s: %v", e.Cluster, strings.Join(parts, "; "), ErrConflict)
}

func (e *ClusterInUseError) Unwrap() error { return ErrConflict }

// listSome lists up to 20 names, and how many more there are.
func listSome(names []string) string {
	const most = 20
	if len(names) <= most {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:most], ", "), len(names)-most)
}

// RemoveCluster removes the named cluster from the fleet of a coordinator
// over several clusters (this coordinator's list, which must be the
// fleet's). It refuses while the cluster holds anything (a
// *ClusterInUseError naming its SKUs and locks: drain and delete them, or
// move them), the fleet's first cluster (the registry), a lock cluster
// without opts.MoveLocks, and when any cluster cannot be reached. Once
// it returns without error the cluster is out of the fleet: processes are
// started with ClusterRemoval.Clusters, a process that names the cluster
// is refused (ErrFleetMismatch), and no SKU can be created in it. Processes
// already running with the old list go on serving (nothing of theirs was
// in the cluster) but can no longer create SKUs in it: restart them with
// the new list. This coordinator is one of them: close it.
// docs/clusters.md states the protocol.
func (c *Coordinator) RemoveCluster(ctx context.Context, name string, opts RemoveClusterOptions) (ClusterRemoval, error) {
	f := c.fleet
	if f == nil {
		return ClusterRemoval{}, fmt.Errorf("remove cluster %q: %w: this coordinator has one cluster", name, ErrInvalidArgument)
	}
	b := f.byName[name]
	switch {
	case b == nil:
		return ClusterRemoval{}, fmt.Errorf("remove cluster %q: %w: not one of %s", name, ErrInvalidArgument, strings.Join(f.names, ", "))
	case b == f.members[0]:
		return ClusterRemoval{}, fmt.Errorf("remove cluster %q: %w: it is the fleet's first cluster, the registry of every SKU's "+
			"placement, which cannot be removed", name, ErrInvalidArgument)
	}
	for _, m := range f.members {
		if err := f.ready(ctx, m); err != nil {
			return ClusterRemoval{}, fmt.Errorf("remove cluster %q: every cluster must be reachable: %w", name, err)
		}
	}
	f.mu.Lock()
	locks := slices.Clone(f.locks)
	f.mu.Unlock()
	out := ClusterRemoval{Cluster: name, LockCluster: slices.Contains(locks, name)}
	out.Clusters = slices.DeleteFunc(slices.Clone(f.names), func(n string) bool { return n == name })
	out.Locks = slices.DeleteFunc(slices.Clone(locks), func(n string) bool { return n == name })
	if out.LockCluster && !opts.MoveLocks {
		return out, fmt.Errorf("remove cluster %q: %w: it is one of the fleet's lock clusters (%s): the lock names placed in it "+
			"would move to the others, so it is removed only with every process of the fleet stopped, and with MoveLocks "+
			"(stockctl remove-cluster --move-locks)", name, ErrInvalidArgument, strings.Join(locks, ", "))
	}
	reg := f.members[0]

	// (1) Begin: no claim names the cluster from now on.
	rk := reg.c.keys.Removed(name)
	begun, _ := json.Marshal(removal{State: removalBegun})
	resp, err := reg.c.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(rk), "=", 0)).
		Then(clientv3.OpPut(rk, string(begun))).Else(clientv3.OpGet(rk)).Commit()
	if err != nil {
		return out, fmt.Errorf("remove cluster %q: %w", name, reg.wrap(err))
	}
	mark := resp.Header.Revision
	if !resp.Succeeded {
		// Begun by an earlier call that did not finish (a removal that
		// finished is refused by the fleet check above).
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return out, fmt.Errorf("remove cluster %q: %w: its removal record changed meanwhile: retry", name, ErrConflict)
		}
		mark = kvs[0].ModRevision
	}
	withdraw := func(cause error) error {
		// Even when ctx has ended (a refusal by its deadline), within a bound.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), withdrawWait)
		defer cancel()
		if _, err := reg.c.kv.Txn(wctx).If(clientv3.Compare(clientv3.ModRevision(rk), "=", mark)).
			Then(clientv3.OpDelete(rk)).Commit(); err != nil {
			return errors.Join(cause, fmt.Errorf("withdraw the removal record of cluster %q (creations there are refused "+
				"until RemoveCluster is run again): %w", name, reg.wrap(err)))
		}
		return cause
	}

	// (2) What is still placed in it.
	inUse, err := f.inUse(ctx, b)
	if err != nil {
		return out, withdraw(fmt.Errorf("remove cluster %q: %w", name, err))
	}
	if len(inUse.SKUs) > 0 || len(inUse.Locks) > 0 {
		if opts.Drain {
			inUse.Draining = true
			return out, fmt.Errorf("remove cluster %q: %w", name, inUse)
		}
		return out, withdraw(fmt.Errorf("remove cluster %q: %w", name, inUse))
	}
	if out.LockCluster {
		if err := othersLeases(ctx, b); err != nil {
			return out, withdraw(fmt.Errorf("remove cluster %q: %w", name, err))
		}
	}

	// (3) The end of its order feed: the revision of the last change to
	// an order record in it, read from its history up to a write of its
	// fleet record (unchanged) made now, after which no order record can
	// change (no SKU is left, and none can be created). The write also
	// checks that it holds no SKU (a one-cluster process could have
	// created one since step 2).
	fk := b.c.keys.Fleet()
	fr, err := b.c.kv.Get(ctx, fk)
	if err != nil {
		return out, withdraw(fmt.Errorf("remove cluster %q: %w", name, b.wrap(err)))
	}
	if len(fr.Kvs) == 0 {
		return out, withdraw(fmt.Errorf("remove cluster %q: %w: its fleet record is gone: retry", name, ErrConflict))
	}
	tr, err := b.c.kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(fk), "=", fr.Kvs[0].ModRevision),
		clientv3.Compare(clientv3.CreateRevision(b.c.keys.MetaPrefix()), "=", 0).WithPrefix()).
		Then(clientv3.OpPut(fk, string(fr.Kvs[0].Value))).Commit()
	if err != nil {
		return out, withdraw(fmt.Errorf("remove cluster %q: %w", name, b.wrap(err)))
	}
	if !tr.Succeeded {
		return out, withdraw(fmt.Errorf("remove cluster %q: %w: its fleet record or its SKUs changed meanwhile: retry", name, ErrConflict))
	}
	out.Revision = tr.Header.Revision
	if out.FeedEnd, err = orderFeedEnd(ctx, b, out.Revision); err != nil {
		return out, withdraw(fmt.Errorf("remove cluster %q: read the end of its order feed: %w", name, b.wrap(err)))
	}

	// (4) Done, in the registry: the cluster leaves the fleet.
	done, _ := json.Marshal(removal{State: removalDone, Revision: out.Revision, FeedEnd: out.FeedEnd})
	dr, err := reg.c.kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(rk), "=", mark)).
		Then(clientv3.OpPut(rk, string(done))).Commit()
	if err != nil {
		return out, fmt.Errorf("remove cluster %q: record it removed in the registry: %w (run the removal again: if it "+
			"says the cluster was removed, it was)", name, reg.wrap(err))
	}
	if !dr.Succeeded {
		return out, fmt.Errorf("remove cluster %q: %w: its removal record changed meanwhile (another removal ran?): "+
			"check the registry's %s", name, ErrConflict, rk)
	}
	f.mu.Lock()
	f.removed = maps.Clone(f.removed) // replaced, not changed in place: check reads it unlocked
	if f.removed == nil {
		f.removed = map[string]removal{}
	}
	f.removed[name] = removal{State: removalDone, Revision: out.Revision, FeedEnd: out.FeedEnd}
	f.mu.Unlock()

	// (5) Its own record says it was removed (for a process that reaches
	// it without reading the registry first).
	gone, _ := json.Marshal(fleetRecord{Cluster: name, Clusters: out.Clusters, Locks: out.Locks, Removed: true})
	if br, err := b.c.kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(fk), "=", out.Revision)).
		Then(clientv3.OpPut(fk, string(gone))).Commit(); err != nil || !br.Succeeded {
		out.Unrewritten = append(out.Unrewritten, name)
	}

	// (6) The other clusters' records, without it.
	for _, m := range f.members {
		if m == b {
			continue
		}
		if err := rewriteRecord(ctx, m, out.Clusters, out.Locks); err != nil {
			out.Unrewritten = append(out.Unrewritten, m.name)
			continue
		}
		if out.LockCluster && slices.Contains(out.Locks, m.name) {
			if r, err := m.c.kv.Get(ctx, m.c.keys.Fleet()); err == nil && r.Header.Revision < out.Revision {
				out.TokensMayDrop = append(out.TokensMayDrop, m.name)
			}
		}
	}
	return out, nil
}

// rewriteRecord rewrites m's fleet record with clusters and locks.
func rewriteRecord(ctx context.Context, m *member, clusters, locks []string) error {
	k := m.c.keys.Fleet()
	resp, err := m.c.kv.Get(ctx, k)
	if err != nil {
		return err
	}
	cmp := clientv3.Compare(clientv3.CreateRevision(k), "=", 0)
	if len(resp.Kvs) > 0 {
		cmp = clientv3.Compare(clientv3.ModRevision(k), "=", resp.Kvs[0].ModRevision)
	}
	val, _ := json.Marshal(fleetRecord{Cluster: m.name, Clusters: clusters, Locks: locks})
	r, err := m.c.kv.Txn(ctx).If(cmp).Then(clientv3.OpPut(k, string(val))).Commit()
	if err != nil {
		return err
	}
	if !r.Succeeded {
		return fmt.Errorf("cluster %q: its fleet record changed meanwhile", m.name)
	}
	return nil
}

// inUse lists what is placed in b: SKUs claimed in it (the registry's
// claims) or whose meta record it holds, and locks held or waited for in
// it.
func (f *fleet) inUse(ctx context.Context, b *member) (*ClusterInUseError, error) {
	reg := f.members[0]
	e := &ClusterInUseError{Cluster: b.name}
	skus := map[string]string{}
	claims, err := reg.c.kv.Get(ctx, reg.c.keys.Placement(""), clientv3.WithPrefix())
	if err != nil {
		return nil, reg.wrap(err)
	}
	for _, kv := range claims.Kvs {
		var cl claim
		if err := json.Unmarshal(kv.Value, &cl); err != nil {
			return nil, fmt.Errorf("%w: placement claim %s: %v", ErrCorrupt, kv.Key, err)
		}
		if cl.Cluster != b.name {
			continue
		}
		sku := strings.TrimPrefix(string(kv.Key), reg.c.keys.Placement(""))
		skus[sku] = " (its creation did not complete: delete it)"
		if cl.Forgetting {
			skus[sku] = " (being deleted: run its delete again)"
		}
	}
	metas, err := b.c.kv.Get(ctx, b.c.keys.MetaPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, b.wrap(err)
	}
	for _, kv := range metas.Kvs {
		sku, err := b.c.keys.ParseMeta(string(kv.Key))
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		skus[sku] = ""
	}
	for sku, note := range skus {
		e.SKUs = append(e.SKUs, sku+note)
	}
	slices.Sort(e.SKUs)
	ls, _, err := b.c.Locks(ctx)
	if err != nil {
		return nil, b.wrap(err)
	}
	for _, l := range ls {
		if l.Semaphore {
			e.Locks = append(e.Locks, "semaphore "+l.Name)
		} else {
			e.Locks = append(e.Locks, l.Name)
		}
	}
	return e, nil
}

// othersLeases fails when a lease other than this process's (its session,
// its direct seller seat) is alive in b: another process is connected to
// it (its lock session, a rebalancer's, its seat), so the fleet is not
// stopped.
func othersLeases(ctx context.Context, b *member) error {
	resp, err := b.c.client.Leases(ctx)
	if err != nil {
		return fmt.Errorf("list its leases, to check that no other process uses it: %w", b.wrap(err))
	}
	own, seat := b.c.locks.Lease(), b.c.stock.SeatLease()
	var others []string
	for _, l := range resp.Leases {
		if id := int64(l.ID); id != own && id != seat {
			others = append(others, fmt.Sprintf("%x", int64(l.ID)))
		}
	}
	if len(others) > 0 {
		return fmt.Errorf("%w: %d lease(s) of other processes are alive in it (%s): a lock cluster is removed with every "+
			"process of the fleet stopped (a stopped process's lease ends within its session TTL)", ErrConflict, len(others), listSome(others))
	}
	return nil
}

// errClusterRemoved marks a creation refused because its cluster is being
// removed, or was.
var errClusterRemoved = errors.New("cluster removed")

// removedTarget is a creation's refusal of a cluster being removed, or
// removed, from the fleet (placement.go's create).
func removedTarget(sku, cluster string) error {
	return fmt.Errorf("create %s: %w: cluster %q is being removed from the fleet, or was (RemoveCluster): create it in "+
		"another cluster%w", sku, ErrConflict, cluster, markErr{errClusterRemoved})
}

// markErr wraps an error for errors.Is without adding to the message.
type markErr struct{ err error }

func (m markErr) Error() string { return "" }
func (m markErr) Unwrap() error { return m.err }

// createHashed creates sku in the cluster its name hashes to (or the one
// its claim names). A name that hashes to a cluster being removed, or
// removed (this process runs with the old list), is placed by its hash
// over the clusters that are not.
func (f *fleet) createHashed(ctx context.Context, sku string, cfg SKUConfig) (segments.Meta, error) {
	meta, err := f.create(ctx, sku, "", cfg)
	if !errors.Is(err, errClusterRemoved) {
		return meta, err
	}
	reg := f.members[0]
	resp, rerr := reg.c.kv.Get(ctx, reg.c.keys.RemovedPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if rerr != nil {
		return meta, err
	}
	out := map[string]bool{}
	for _, kv := range resp.Kvs {
		out[strings.TrimPrefix(string(kv.Key), reg.c.keys.RemovedPrefix())] = true
	}
	names := slices.DeleteFunc(slices.Clone(f.names), func(n string) bool { return out[n] })
	if len(names) == 0 {
		return meta, err
	}
	return f.create(ctx, sku, rendezvous(names, sku), cfg)
}

// RemovedClusters names the clusters removed from the fleet of a
// coordinator over several, each with the end of its order feed
// (ClusterRemoval.FeedEnd); nil for one cluster. They are read from the
// registry when this process checks it (at NewClusters, or when first
// needed, within WithFleetCheckWait): a removal made after that is of a
// cluster this process still has in its list. A merged feed takes them
// (feed.Config.Removed) to refuse cursors that would skip a removed
// cluster's events.
func (c *Coordinator) RemovedClusters(ctx context.Context) (map[string]int64, error) {
	f := c.fleet
	if f == nil {
		return nil, nil
	}
	cctx, cancel := context.WithTimeout(ctx, f.checkWait)
	defer cancel()
	if err := f.ready(cctx, f.members[0]); err != nil {
		return nil, fmt.Errorf("the clusters removed from the fleet: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int64{}
	for n, rm := range f.removed {
		if rm.State == removalDone {
			out[n] = rm.FeedEnd
		}
	}
	return out, nil
}

// feedEndRestarts bounds how often orderFeedEnd starts again after
// history was compacted under it.
const feedEndRestarts = 8

// orderFeedEnd is the revision of the last change to an order record in
// m's cluster up to until, a revision at which m's fleet record was
// written: it watches the key range from the fleet record to the order
// records (the bulk of a cluster's writes, its stock counters, is outside
// it) from the start of the history etcd keeps, up to until. History
// compacted before an order change makes the answer the compacted
// revision (no later than the change could have been).
func orderFeedEnd(ctx context.Context, m *member, until int64) (int64, error) {
	root := strings.TrimSuffix(m.c.keys.Orders("x"), "x/")
	from, end := m.c.keys.Fleet(), clientv3.GetPrefixRangeEnd(root)
	if from >= root {
		return 0, fmt.Errorf("keys: the fleet record %q does not sort before the orders %q", from, root)
	}
	start, floor := int64(1), int64(0)
	for range feedEndRestarts {
		last, compacted, err := watchFeedEnd(ctx, m, from, end, root, start, floor, until)
		if compacted == 0 {
			return last, err
		}
		start, floor = compacted, compacted
	}
	return 0, fmt.Errorf("its history was compacted %d times while it was read", feedEndRestarts)
}

// watchFeedEnd is one watch of orderFeedEnd: from start, the last order
// change up to until (floor when none), or the compacted revision to
// start again from.
func watchFeedEnd(ctx context.Context, m *member, from, end, root string, start, floor, until int64) (last, compacted int64, err error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	last = floor
	for resp := range m.c.client.Watch(wctx, from, clientv3.WithRange(end), clientv3.WithRev(start)) {
		if resp.CompactRevision > 0 {
			return 0, resp.CompactRevision, nil
		}
		if err := resp.Err(); err != nil {
			return 0, 0, err
		}
		for _, ev := range resp.Events {
			if strings.HasPrefix(string(ev.Kv.Key), root) && ev.Kv.ModRevision > last {
				last = ev.Kv.ModRevision
			}
			if ev.Kv.ModRevision >= until {
				return last, 0, nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	return 0, 0, errors.New("its watch ended before the revision it waited for")
}
