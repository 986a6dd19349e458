package feed

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/etcdcall"
)

// SnapshotPage is how many order records Snapshot reads per request. A
// record is about 300 bytes, so a page is about 300 KB: small enough not
// to stall etcd, large enough that a sale of 100,000 orders takes 100
// reads.
const SnapshotPage = 1000

// snapshotAttempts bounds how often Snapshot starts again because etcd
// compacted past the revision it was reading at.
const snapshotAttempts = 3

// Snapshot reads every order record of cfg's scope (its Prefix and SKU;
// Since, Until and UntilOpen are ignored) at one revision, and returns
// them as a Batch: one event per order, whose Kind is the order's current
// state and whose Revision is that of its latest change, in feed order.
// The batch's Cursor is the snapshot's revision: a feed opened Since it
// delivers exactly the changes after the snapshot. A snapshot of a scope
// without orders has no events, and still a Cursor.
//
// This is how to start again when a cursor is older than etcd's
// compaction (ErrCompacted), or how to start at all without replaying
// history: apply the snapshot as the latest state of each order, store its
// Cursor in the same transaction, then follow a feed from it. Orders whose
// records were deleted (pruned) are not in a snapshot.
//
// The whole snapshot is held in memory (about 300 bytes an order). It is
// read in pages of SnapshotPage records at one revision; if etcd compacts
// past that revision meanwhile, Snapshot starts again at a newer one. ctx
// bounds it all.
func Snapshot(ctx context.Context, client *clientv3.Client, cfg Config) (Batch, error) {
	s, err := newScope(cfg)
	if err != nil {
		return Batch{}, err
	}
	kv := etcdcall.KV(client)
	for attempt := 1; ; attempt++ {
		b, err := s.snapshot(ctx, kv)
		if errors.Is(err, rpctypes.ErrCompacted) && attempt < snapshotAttempts {
			continue
		}
		if err != nil {
			return Batch{}, fmt.Errorf("snapshot of %s: %w", s, err)
		}
		return b, nil
	}
}

func (s scope) snapshot(ctx context.Context, kv clientv3.KV) (Batch, error) {
	rev, err := s.check(ctx, kv)
	if err != nil {
		return Batch{}, err
	}
	var out []Event
	from := s.start
	for {
		resp, err := kv.Get(ctx, from, clientv3.WithRange(s.end), clientv3.WithRev(rev), clientv3.WithLimit(SnapshotPage),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		if err != nil {
			return Batch{}, err
		}
		for _, kv := range resp.Kvs {
			e, ok, err := decode(s.space, kv)
			if err != nil {
				return Batch{}, err
			}
			if ok {
				out = append(out, e)
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	sortEvents(out)
	return Batch{Events: out, Cursor: rev}, nil
}

// SnapshotPages reads what Snapshot reads, at one revision, but hands it
// to page a page of at most SnapshotPage events at a time, as each is read
// from etcd, so that memory holds one page whatever the scope's size; a
// page that blocks (a consumer that does not keep up) holds the next read
// back. Each order comes once, its latest event; a page is in feed order,
// but the pages are in key order (by SKU and order ID): a later page may
// hold an event of an earlier revision. Every page carries the snapshot's Cursor
// (its revision) and last is true on the final page (an empty one when
// the scope has no orders). If etcd compacts past the snapshot's revision
// before the first page, SnapshotPages starts again at a newer one; after
// it, it fails with an error that matches ErrCompacted: start again. An
// error of page ends it with that error.
func SnapshotPages(ctx context.Context, client *clientv3.Client, cfg Config, page func(b Batch, last bool) error) error {
	s, err := newScope(cfg)
	if err != nil {
		return err
	}
	kv := etcdcall.KV(client)
	for attempt := 1; ; attempt++ {
		sent, err := s.snapshotPages(ctx, kv, page)
		if errors.Is(err, rpctypes.ErrCompacted) {
			if !sent && attempt < snapshotAttempts {
				continue
			}
			return fmt.Errorf("snapshot of %s: %w: %w", s, ErrCompacted, err)
		}
		if err != nil && !sent {
			return fmt.Errorf("snapshot of %s: %w", s, err)
		}
		return err
	}
}

// snapshotPages reports whether a page was handed over.
func (s scope) snapshotPages(ctx context.Context, kv clientv3.KV, page func(b Batch, last bool) error) (sent bool, err error) {
	rev, err := s.check(ctx, kv)
	if err != nil {
		return false, err
	}
	from := s.start
	for {
		resp, err := kv.Get(ctx, from, clientv3.WithRange(s.end), clientv3.WithRev(rev), clientv3.WithLimit(SnapshotPage),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		if err != nil {
			return sent, err
		}
		evs := make([]Event, 0, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			e, ok, err := decode(s.space, kv)
			if err != nil {
				return sent, err
			}
			if ok {
				evs = append(evs, e)
			}
		}
		last := !resp.More || len(resp.Kvs) == 0
		if !last {
			from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
		resp = nil // the page's events only, while page runs
		sortEvents(evs)
		if err := page(Batch{Events: evs, Cursor: rev}, last); err != nil {
			return true, err
		}
		sent = true
		if last {
			return true, nil
		}
	}
}
