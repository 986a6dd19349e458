package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
	"github.com/stockctl/stockctl/segments"
)

// ttl is the session TTL of the scenarios that wait for leases to expire:
// etcd's minimum with default election settings.
const ttl = 2 * time.Second

// freeTolerance is added to the bound "locks free within TTL + 1 s"
// (and "a new leader within the TTL"): the time from a SIGKILL to another
// process running under the freed lock also includes etcd's lease-expiry
// tick (500 ms), the revoke through raft, the watch event and our own
// scheduling, all on a shared 2-core machine under the race detector.
const freeTolerance = time.Second

// newCoord returns a coordinator on a client of its own over endpoints, as a
// separate process would have; it is closed before the client at cleanup.
func newCoord(t testing.TB, endpoints []string, opts ...coordinator.Option) *coordinator.Coordinator {
	t.Helper()
	cli := etcdtest.NewClient(t, endpoints...)
	c, err := coordinator.New(cli, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// retry calls op with a fresh per-attempt timeout until it returns nil or
// an error for which transient is false, bounded by attempts and by limit.
// It is for calls that must get through after a fault was healed (gRPC
// needs a moment to reconnect).
func retry(t testing.TB, what string, limit time.Duration, transient func(error) bool, op func(ctx context.Context) error) error {
	t.Helper()
	limit = etcdtest.HangLimit(limit)
	deadline := time.Now().Add(limit)
	var err error
	for attempt := 1; attempt <= 100; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err = op(ctx)
		cancel()
		if err == nil || !transient(err) {
			return err
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: still failing after %v: %v", what, limit, err)
	return err
}

// anyErr treats every error as transient.
func anyErr(error) bool { return true }

// notStockAnswer treats every error but a definite answer about stock or
// orders as transient.
func notStockAnswer(err error) bool {
	return !errors.Is(err, coordinator.ErrInsufficientStock) && !errors.Is(err, coordinator.ErrConflict) &&
		!errors.Is(err, coordinator.ErrOrderNotFound) && !errors.Is(err, coordinator.ErrInvalidArgument)
}

// mustAudit audits sku and fails t unless the books balance.
func mustAudit(t testing.TB, c *coordinator.Coordinator, sku string) *coordinator.AuditReport {
	t.Helper()
	var rep *coordinator.AuditReport
	retry(t, "audit "+sku, 20*time.Second, anyErr, func(ctx context.Context) (err error) {
		rep, err = c.Audit(ctx, sku)
		return err
	})
	if !rep.OK {
		t.Fatalf("audit %s: the books do not balance: %+v", sku, rep)
	}
	return rep
}

// routeKeyFor returns a route key that routes to segment seg of n.
func routeKeyFor(t testing.TB, n, seg int) string {
	t.Helper()
	return routeKeysFor(t, n, seg, 1)[0]
}

// routeKeysFor returns k distinct route keys that route to segment seg of n.
func routeKeysFor(t testing.TB, n, seg, k int) []string {
	t.Helper()
	var keys []string
	for i := 0; i < 1_000_000 && len(keys) < k; i++ {
		if key := fmt.Sprintf("user-%d", i); segments.Route(key, n) == seg {
			keys = append(keys, key)
		}
	}
	if len(keys) < k {
		t.Fatalf("no %d route keys for segment %d of %d", k, seg, n)
	}
	return keys
}

// orderState reads an order's record (its ID's claim) directly from etcd;
// recorded is true when it exists. No other per-order key may exist: an
// orderid/ claim (written only before records were their own claims) fails
// t.
func orderState(t testing.TB, c *coordinator.Coordinator, sku, order string) (o segments.Order, recorded bool) {
	t.Helper()
	k := engines.Of(c).Keys
	var resp *clientv3.TxnResponse
	retry(t, "read order "+order, 20*time.Second, anyErr, func(ctx context.Context) (err error) {
		resp, err = c.Client().Txn(ctx).Then(clientv3.OpGet(k.Prefix()+"orderid/"+order), clientv3.OpGet(k.Order(sku, order))).Commit()
		return err
	})
	claim := resp.Responses[0].GetResponseRange().Kvs
	rec := resp.Responses[1].GetResponseRange().Kvs
	if len(claim) != 0 {
		t.Fatalf("order %q has an orderid/ claim beside its record", order)
	}
	if len(rec) == 0 {
		return segments.Order{}, false
	}
	o, err := segments.DecodeOrder(string(rec[0].Key), rec[0].Value) // checks that the parts add up
	if err != nil {
		t.Fatalf("order %q: %v", order, err)
	}
	return o, true
}

// moveLog collects the moves rebalancers report.
type moveLog struct {
	mu    sync.Mutex
	moves []rebalance.Move
}

func (l *moveLog) add(m rebalance.Move) {
	l.mu.Lock()
	l.moves = append(l.moves, m)
	l.mu.Unlock()
}

func (l *moveLog) snapshot() []rebalance.Move {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]rebalance.Move(nil), l.moves...)
}

// startRebalancer runs a rebalancer until the returned stop is called (or
// the test ends); stop waits for Run to return.
func startRebalancer(t testing.TB, c *coordinator.Coordinator, cfg rebalance.Config) (*rebalance.Rebalancer, func()) {
	t.Helper()
	r, err := rebalance.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	t.Cleanup(stop)
	return r, stop
}

// clientv3WithPrefixCount counts the keys under a prefix.
func clientv3WithPrefixCount() []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCountOnly()}
}
