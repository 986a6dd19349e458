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
			e, err := decode(s.space, kv)
			if err != nil {
				return Batch{}, err
			}
			out = append(out, e)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	sortEvents(out)
	return Batch{Events: out, Cursor: rev}, nil
}
