package rebalance

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/segments"
)

// stock is what the rebalancer needs of the segment engine
// (*segments.Engine): the moves and the expiry sweep, each fenced by the
// leader's compare.
type stock interface {
	SKUs(ctx context.Context) ([]string, error)
	RefillBelow(ctx context.Context, sku string, want map[int]int64, threshold int64, wait time.Duration, fence ...clientv3.Cmp) (map[int]int64, int64, error)
	Drain(ctx context.Context, sku string, seg int, wait time.Duration, fence ...clientv3.Cmp) (int64, int64, error)
	NextDeadline(ctx context.Context, sku string) (time.Time, bool, error)
	ExpireDue(ctx context.Context, sku string, now time.Time, limit int, fence ...clientv3.Cmp) ([]segments.Expiry, error)
}

// deps is what the rebalancer reaches of its coordinator: the segment
// engine through stock, the session its election runs under (the
// coordinator's own: everything a process holds shares one lease), and etcd.
type deps struct {
	stock   stock
	session func(ctx context.Context) (*concurrency.Session, error)
	client  *clientv3.Client
	kv      clientv3.KV // reads and fenced writes, no caller deadline sent to etcd
	keys    keys.Space
}

func newDeps(c *coordinator.Coordinator) deps {
	e := engines.Of(c)
	return deps{stock: e.Stock, session: e.Locks.Session, client: e.Client, kv: e.KV, keys: e.Keys}
}
