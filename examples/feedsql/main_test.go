package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/rebalance"
	"github.com/stockctl/stockctl/segments"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// hang bounds every wait: generous, only there so that a bug shows as a
// failure rather than a test binary killed by -timeout.
const hang = 2 * time.Minute

// build compiles feedsql into a temporary directory.
func build(t *testing.T) string {
	t.Helper()
	// The go that runs these tests: on PATH, or where go test puts it
	// (GOROOT is in the tests' environment).
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "feedsql")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, gobin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// sale runs a sale of every kind of transition on two coordinators, with
// an elected rebalancer that expires abandoned reservations, until stop.
type sale struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	coords []*coordinator.Coordinator
}

func startSale(t *testing.T, e *etcdtest.Single, prefix string, skus []string) *sale {
	t.Helper()
	s := &sale{}
	for range 2 {
		c, err := coordinator.New(e.Client(t), coordinator.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		s.coords = append(s.coords, c)
	}
	for _, sku := range skus {
		if _, err := s.coords[0].CreateSKU(t.Context(), sku, coordinator.SKUConfig{Total: 1_000_000, Segments: 4,
			InitialFill: 1000, LowWatermark: 50, RefillBatch: 200}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	s.cancel = cancel
	r, err := rebalance.New(s.coords[0], rebalance.Config{ExpiryPoll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.wg.Go(func() { _ = r.Run(ctx) })
	for w := range 6 {
		s.wg.Go(func() {
			c := s.coords[w%len(s.coords)]
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; ctx.Err() == nil; i++ {
				sku := skus[rng.IntN(len(skus))]
				order(ctx, c, rng, sku, fmt.Sprintf("w%d-%d", w, i))
			}
		})
	}
	t.Cleanup(s.stop)
	return s
}

// stop ends the sale. Closing the coordinators waits for their commits in
// flight, so no order lands after it.
func (s *sale) stop() {
	s.cancel()
	s.wg.Wait()
	for _, c := range s.coords {
		_ = c.Close()
	}
}

// order places one order and takes it along a random path; errors (the
// sale being stopped) just end the path.
func order(ctx context.Context, c *coordinator.Coordinator, rng *rand.Rand, sku, id string) {
	buyer := coordinator.WithBuyer(fmt.Sprintf("b%d", rng.IntN(100)))
	if rng.IntN(3) == 0 {
		if _, err := c.Allocate(ctx, sku, id, 1+rng.Int64N(3), id, buyer); err == nil && rng.IntN(4) == 0 {
			_, _ = c.Release(ctx, sku, id)
		}
		return
	}
	path := rng.IntN(10)
	ttl := time.Hour
	if path >= 7 {
		ttl = 30 * time.Millisecond // abandoned: the rebalancer expires it
	}
	if _, err := c.Reserve(ctx, sku, id, 1, id, ttl, buyer); err != nil {
		return
	}
	switch {
	case path < 4:
		if _, err := c.Confirm(ctx, sku, id); err == nil && path == 0 {
			_, _ = c.Release(ctx, sku, id)
		}
	case path < 6:
		_, _ = c.Cancel(ctx, sku, id)
	case path < 7:
		_, _ = c.Release(ctx, sku, id)
	}
}

// consumer is one run of the feedsql binary.
type consumer struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan error
}

func startConsumer(t *testing.T, bin string, env []string, args ...string) *consumer {
	t.Helper()
	c := &consumer{cmd: exec.Command(bin, args...), out: &syncBuffer{}, done: make(chan error, 1)}
	c.cmd.Stdout = c.out
	c.cmd.Stderr = c.out
	c.cmd.Env = append(os.Environ(), env...)
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.done <- c.cmd.Wait() }()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.done
		c.done <- nil
	})
	return c
}

// wait waits for the run to end and returns how.
func (c *consumer) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-c.done:
		c.done <- err
		return err
	case <-time.After(hang):
		t.Fatalf("feedsql did not end within %v:\n%s", hang, c.out.String())
		return nil
	}
}

func killedBySIGKILL(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// The consumer killed with SIGKILL again and again, in the middle of a
// batch (it kills itself after N rows, its transaction open) and from
// outside (at whatever point it is), with a compaction past its cursor in
// between, while a sale runs: once the sale is over and one last run has
// caught up, its table is exactly the order records in etcd, and agrees
// with the coordinator's audit.
func TestKilledConsumerEndsExact(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("SIGKILL is Unix")
	}
	bin := build(t)
	e := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	const prefix = "/feedsql/"
	skus := []string{"tee", "mug"}
	s := startSale(t, e, prefix, skus)
	db := filepath.Join(t.TempDir(), "orders.db")
	args := []string{"--endpoints", e.Endpoints()[0], "--prefix", prefix, "--db", db}
	client := e.Client(t)
	rng := rand.New(rand.NewPCG(1, 2))

	for round := range 8 {
		if round == 5 {
			// Compact past the consumer's cursor: its next run must start
			// again from a snapshot. Two writes first (outside the prefix),
			// so that the compaction is past the revision after the cursor
			// even if the sale wrote nothing since the last run ended: on a
			// busy machine it had not, the compaction was at the cursor
			// itself, and the run resumed without one.
			var rev int64
			for range 2 {
				resp, err := client.Put(t.Context(), "x", "compaction point")
				if err != nil {
					t.Fatal(err)
				}
				rev = resp.Header.Revision
			}
			if _, err := client.Compact(t.Context(), rev); err != nil {
				t.Fatal(err)
			}
		}
		if round%2 == 0 {
			n := 1 + rng.IntN(300)
			c := startConsumer(t, bin, []string{fmt.Sprintf("FEEDSQL_CRASH_AFTER=%d", n)}, args...)
			if err := c.wait(t); !killedBySIGKILL(err) {
				t.Fatalf("round %d: feedsql with FEEDSQL_CRASH_AFTER=%d ended with %v, want SIGKILL:\n%s", round, n, err, c.out.String())
			}
			t.Logf("round %d: killed itself after %d rows: %s", round, n, summary(c.out.String()))
			continue
		}
		c := startConsumer(t, bin, nil, args...)
		batches := 1 + rng.IntN(5)
		waitOutput(t, c, func(out string) bool { return strings.Count(out, "applied ") >= batches })
		if round == 5 && !strings.Contains(c.out.String(), "snapshot orders=") {
			t.Fatalf("round %d: no snapshot after the compaction:\n%s", round, c.out.String())
		}
		if err := c.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := c.wait(t); !killedBySIGKILL(err) {
			t.Fatalf("round %d: feedsql ended with %v, want SIGKILL:\n%s", round, err, c.out.String())
		}
		t.Logf("round %d: killed: %s", round, summary(c.out.String()))
	}

	s.stop()
	c := startConsumer(t, bin, nil, append(args, "--until-now")...)
	if err := c.wait(t); err != nil {
		t.Fatalf("the last run: %v\n%s", err, c.out.String())
	}
	auditor, err := coordinator.New(client, coordinator.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer auditor.Close()
	compare(t, client, auditor, prefix, db, skus)
}

// summary is the first and last lines of a run's output.
func summary(out string) string {
	ls := strings.Split(strings.TrimSpace(out), "\n")
	if len(ls) == 1 {
		return ls[0]
	}
	return fmt.Sprintf("%s … %s (%d lines)", ls[0], ls[len(ls)-1], len(ls))
}

func waitOutput(t *testing.T, c *consumer, ok func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(hang)
	for !ok(c.out.String()) {
		select {
		case err := <-c.done:
			c.done <- err
			t.Fatalf("feedsql ended: %v\n%s", err, c.out.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("feedsql's output after %v:\n%s", hang, c.out.String())
		}
	}
}

// row is an order as the table has it, and as etcd should.
type row struct {
	sku, state, buyer string
	qty, revision     int64
}

// compare checks the table against the order records in etcd, and
// against each SKU's audit.
func compare(t *testing.T, client *clientv3.Client, c *coordinator.Coordinator, prefix, path string, skus []string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	got := map[string]row{}
	rows, err := db.Query(`SELECT order_id, sku, state, COALESCE(buyer, ''), qty, revision FROM orders`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var r row
		if err := rows.Scan(&id, &r.sku, &r.state, &r.buyer, &r.qty, &r.revision); err != nil {
			t.Fatal(err)
		}
		got[id] = r
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	space, _ := keys.New(prefix)
	resp, err := client.Get(t.Context(), space.Prefix()+"orders/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]row{}
	var last int64
	for _, kv := range resp.Kvs {
		last = max(last, kv.ModRevision)
		o, err := segments.DecodeOrder(string(kv.Key), kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		state := "allocated"
		switch {
		case o.State == segments.StateExpired:
			state = "expired"
		case o.Released && o.State == segments.StateReserved:
			state = "cancelled"
		case o.Released:
			state = "released"
		case o.State != "":
			state = string(o.State)
		}
		want[o.ID] = row{sku: o.SKU, state: state, buyer: o.Buyer, qty: o.Qty, revision: kv.ModRevision}
	}
	for id, w := range want {
		if g, ok := got[id]; !ok || g != w {
			t.Errorf("order %s: table %+v (present %v), etcd %+v", id, g, ok, w)
		}
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			t.Errorf("order %s is in the table, not in etcd", id)
		}
	}
	var cursor int64
	if err := db.QueryRow(`SELECT revision FROM feed_cursor`).Scan(&cursor); err != nil || cursor < last {
		t.Errorf("cursor %d (%v), want at least the last order's revision %d", cursor, err, last)
	}
	for _, sku := range skus {
		a, err := c.Audit(t.Context(), sku)
		if err != nil || !a.OK {
			t.Fatalf("audit %s: %+v, %v", sku, a, err)
		}
		var orders, released, expired, allocated int64
		if err := db.QueryRow(`SELECT COUNT(*),
			COUNT(*) FILTER (WHERE state IN ('released', 'cancelled')),
			COUNT(*) FILTER (WHERE state = 'expired'),
			COALESCE(SUM(qty) FILTER (WHERE state IN ('allocated', 'reserved', 'confirmed')), 0)
			FROM orders WHERE sku = ?`, sku).Scan(&orders, &released, &expired, &allocated); err != nil {
			t.Fatal(err)
		}
		if orders != a.Orders || released != a.ReleasedOrders || expired != a.ExpiredOrders || allocated != a.Allocated {
			t.Errorf("%s: table has %d orders, %d released, %d expired, %d units held; the audit %d, %d, %d, %d",
				sku, orders, released, expired, allocated, a.Orders, a.ReleasedOrders, a.ExpiredOrders, a.Allocated)
		}
	}
	t.Logf("%d orders in the table, as in etcd", len(got))
}

// syncBuffer collects a child's output for the test to read meanwhile.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
