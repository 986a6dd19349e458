package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The fleet records. Every cluster of a fleet holds one (keys.Fleet):
// its own name, the fleet's clusters in order, and the lock clusters (the
// clusters named locks are placed over: the fleet's clusters when the
// fleet was first used, kept as clusters are added, so that adding one
// moves no lock). A process checks a cluster's record before it serves
// anything of that cluster:
//
//   - the record names another cluster: the endpoints given for one
//     cluster reach another: refused (ErrFleetMismatch);
//   - the fleet's list is not a prefix of this process's list (another
//     order, another registry, a cluster this process lacks): refused;
//   - this process's list extends it (clusters added at the end): the
//     record is updated, so that processes started with the old list are
//     refused from then on;
//   - no record: written, once the lock clusters are known (from another
//     cluster's record, or, when no cluster has one, as a new fleet). A
//     cluster other than the registry must then hold no SKU: SKUs from
//     before the fleet can only be in the registry, where creations look
//     for them.
//
// A cluster removed from the fleet (RemoveCluster, remove.go) is recorded
// in the registry (keys.Removed): records are read without it (a record
// not yet rewritten still lists it), a process that names it is refused,
// and its own record says it was removed (refused too).

type fleetRecord struct {
	Cluster  string   `json:"cluster"`
	Clusters []string `json:"clusters"`
	Locks    []string `json:"locks"`
	// Removed says this cluster was removed from the fleet.
	Removed bool `json:"removed,omitempty"`
}

// ready checks m's fleet record if that has not been done yet. Its error
// names the cluster (ErrClusterUnavailable when it did not answer) or is
// ErrFleetMismatch.
func (f *fleet) ready(ctx context.Context, m *member) error {
	m.mu.Lock()
	ok := m.checked
	m.mu.Unlock()
	if ok {
		return nil
	}
	err := f.check(ctx)
	m.mu.Lock()
	ok = m.checked
	m.mu.Unlock()
	if ok {
		return nil
	}
	if err != nil && errors.Is(err, ErrFleetMismatch) {
		return err
	}
	return &ClusterError{Cluster: m.name, Unavailable: true, Err: fmt.Errorf("its fleet record could not be checked: %w", err)}
}

// check reads the fleet record of every member not yet checked, at once,
// and writes or updates them (see the top of this file). Members that do
// not answer before ctx ends stay unchecked.
func (f *fleet) check(ctx context.Context) error {
	select {
	case f.gate <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-f.gate }()

	type read struct {
		m       *member
		rec     *fleetRecord
		rev     int64              // the record's mod revision (0: none)
		skus    bool               // the cluster holds a SKU meta record
		stale   bool               // its record lists a removed cluster
		removed map[string]removal // the registry's removal records
		err     error
	}
	var pending []*member
	for _, m := range f.members {
		m.mu.Lock()
		if !m.checked {
			pending = append(pending, m)
		}
		m.mu.Unlock()
	}
	if len(pending) == 0 {
		return nil
	}
	reads := make([]read, len(pending))
	done := make(chan struct{}, len(pending))
	for i, m := range pending {
		go func() {
			defer func() { done <- struct{}{} }()
			r := read{m: m}
			ops := []clientv3.Op{clientv3.OpGet(m.c.keys.Fleet()),
				clientv3.OpGet(m.c.keys.MetaPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())}
			if m == f.members[0] {
				ops = append(ops, clientv3.OpGet(m.c.keys.RemovedPrefix(), clientv3.WithPrefix()))
			}
			resp, err := m.c.kv.Txn(ctx).Then(ops...).Commit()
			if err != nil {
				r.err = err
				reads[i] = r
				return
			}
			if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
				var rec fleetRecord
				if err := json.Unmarshal(kvs[0].Value, &rec); err != nil {
					r.err = fmt.Errorf("%w: fleet record of cluster %q: %v", ErrCorrupt, m.name, err)
				}
				r.rec, r.rev = &rec, kvs[0].ModRevision
			}
			r.skus = resp.Responses[1].GetResponseRange().Count > 0
			if m == f.members[0] {
				r.removed = map[string]removal{}
				for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
					var rm removal
					if err := json.Unmarshal(kv.Value, &rm); err != nil {
						r.err = fmt.Errorf("%w: removal record %s: %v", ErrCorrupt, kv.Key, err)
					}
					r.removed[strings.TrimPrefix(string(kv.Key), m.c.keys.RemovedPrefix())] = rm
				}
			}
			reads[i] = r
		}()
	}
	for range pending {
		<-done
	}

	for _, r := range reads {
		if r.err == nil && r.removed != nil {
			f.mu.Lock()
			f.removed = r.removed
			f.mu.Unlock()
		}
	}
	f.mu.Lock()
	locks := f.locks
	removed := f.removed
	f.mu.Unlock()
	for _, n := range f.names {
		if rm, ok := removed[n]; ok && rm.State == removalDone {
			return fmt.Errorf("%w: cluster %q was removed from the fleet (its revision %d; docs/deploy.md, removing a cluster): "+
				"give every process the fleet's clusters without it", ErrFleetMismatch, n, rm.Revision)
		}
	}
	var unanswered []string
	var errs []error
	for i, r := range reads {
		if r.err == nil && r.rec != nil {
			// A record not rewritten since a removal still lists the removed
			// cluster: read it without.
			rec := *r.rec
			rec.Clusters, rec.Locks = withoutRemoved(rec.Clusters, removed), withoutRemoved(rec.Locks, removed)
			stale := len(rec.Clusters) != len(r.rec.Clusters) || len(rec.Locks) != len(r.rec.Locks)
			reads[i].rec, reads[i].stale = &rec, stale
			r.rec, r.stale = &rec, stale
		}
		switch {
		case r.err != nil:
			unanswered = append(unanswered, r.m.name)
			errs = append(errs, fmt.Errorf("cluster %q: %w", r.m.name, r.err))
		case r.rec == nil:
		case r.rec.Cluster != r.m.name:
			return fmt.Errorf("%w: the endpoints given for cluster %q reach cluster %q", ErrFleetMismatch, r.m.name, r.rec.Cluster)
		case r.rec.Removed:
			return fmt.Errorf("%w: cluster %q was removed from the fleet of clusters %s (docs/deploy.md, removing a cluster): "+
				"give every process the fleet's clusters without it", ErrFleetMismatch, r.m.name, strings.Join(r.rec.Clusters, ","))
		case !isPrefix(r.rec.Clusters, f.names):
			return fmt.Errorf("%w: cluster %q belongs to a fleet of clusters %s; this process was given %s "+
				"(every process names the same clusters in the same order; clusters are added at the end)",
				ErrFleetMismatch, r.m.name, strings.Join(r.rec.Clusters, ","), strings.Join(f.names, ","))
		case locks == nil:
			locks = r.rec.Locks
		case !slices.Equal(locks, r.rec.Locks):
			return fmt.Errorf("%w: cluster %q places locks over %s, another cluster over %s", ErrFleetMismatch,
				r.m.name, strings.Join(r.rec.Locks, ","), strings.Join(locks, ","))
		}
	}
	if locks == nil {
		if len(unanswered) > 0 {
			// A new fleet, or one whose records are in the clusters that
			// did not answer: wait for them.
			return errors.Join(errs...)
		}
		locks = slices.Clone(f.names) // a new fleet
	}
	f.mu.Lock()
	f.locks = locks
	f.mu.Unlock()
	for _, r := range reads {
		if r.err != nil {
			continue
		}
		if r.rec != nil && slices.Equal(r.rec.Clusters, f.names) && !r.stale {
			r.m.mu.Lock()
			r.m.checked = true
			r.m.mu.Unlock()
			continue
		}
		if r.rec == nil && r.skus && r.m != f.members[0] {
			return fmt.Errorf("%w: cluster %q holds SKUs but has no fleet record: only the fleet's first cluster "+
				"(%q) may hold SKUs from before the fleet", ErrFleetMismatch, r.m.name, f.members[0].name)
		}
		val, _ := json.Marshal(fleetRecord{Cluster: r.m.name, Clusters: f.names, Locks: locks})
		key := r.m.c.keys.Fleet()
		cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		if r.rec != nil {
			cmp = clientv3.Compare(clientv3.ModRevision(key), "=", r.rev)
		}
		resp, err := r.m.c.kv.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, string(val))).Commit()
		if err != nil {
			errs = append(errs, fmt.Errorf("cluster %q: %w", r.m.name, err))
			continue
		}
		if !resp.Succeeded {
			errs = append(errs, fmt.Errorf("cluster %q: its fleet record changed meanwhile: retry", r.m.name))
			continue
		}
		r.m.mu.Lock()
		r.m.checked = true
		r.m.mu.Unlock()
	}
	return errors.Join(errs...)
}

// isPrefix reports whether p is a prefix of s.
func isPrefix(p, s []string) bool { return len(p) <= len(s) && slices.Equal(p, s[:len(p)]) }

// lockMember returns the member a named lock (of any kind) is placed in:
// the rendezvous choice of its name over the fleet's lock clusters.
func (f *fleet) lockMember(ctx context.Context, name string) (*member, error) {
	f.mu.Lock()
	locks := f.locks
	f.mu.Unlock()
	if locks == nil {
		if err := f.check(ctx); err != nil && errors.Is(err, ErrFleetMismatch) {
			return nil, err
		}
		f.mu.Lock()
		locks = f.locks
		f.mu.Unlock()
		if locks == nil {
			return nil, fmt.Errorf("lock %q: %w: no cluster's fleet record could be read, so where locks live is not known yet",
				name, ErrClusterUnavailable)
		}
	}
	m := f.byName[rendezvous(locks, name)]
	if err := f.ready(ctx, m); err != nil {
		return nil, err
	}
	return m, nil
}
