package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// gathered is one scrape of a registry: family name → its metrics.
type gathered map[string][]*dto.Metric

func gather(t *testing.T, reg prometheus.Gatherer) gathered {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	g := gathered{}
	for _, f := range fams {
		g[f.GetName()] = f.GetMetric()
	}
	return g
}

// hasLabels reports whether m carries every label of want (and, with
// exact, no other).
func hasLabels(m *dto.Metric, want map[string]string, exact bool) bool {
	if exact && len(m.GetLabel()) != len(want) {
		return false
	}
	found := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
			found++
		}
	}
	return found == len(want)
}

// number is a counter's or gauge's value, or a histogram's sample count.
func number(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
}

// value is the number of the series of name with exactly labels; found is
// false if there is none.
func (g gathered) value(name string, labels map[string]string) (v float64, found bool) {
	for _, m := range g[name] {
		if hasLabels(m, labels, true) {
			return number(m), true
		}
	}
	return 0, false
}

// sum adds the numbers of every series of name whose labels include match.
func (g gathered) sum(name string, match map[string]string) float64 {
	var s float64
	for _, m := range g[name] {
		if hasLabels(m, match, false) {
			s += number(m)
		}
	}
	return s
}

// Every operation of the coordinator shows in its metrics with the outcome
// it had, the stock gauges are etcd's figures, and the names pass
// Prometheus's own lint (naming conventions, units, help).
func TestMetricsCountWhatHappened(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	reg := prometheus.NewRegistry()
	c, err := coordinator.New(etcd.Client(t), coordinator.WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := t.Context()
	const sku = "metered"
	mustCreate(t, c, sku, coordinator.SKUConfig{Total: 100, Segments: 4, InitialFill: 40})

	var drained int64
	steps := []struct {
		name string
		do   func() error
		want error // nil: must succeed
	}{
		{"served", func() error { _, err := c.Allocate(ctx, sku, "m-1", 2, "alice"); return err }, nil},
		{"replayed", func() error { _, err := c.Allocate(ctx, sku, "m-1", 2, "alice"); return err }, nil},
		{"conflict", func() error { _, err := c.Allocate(ctx, sku, "m-1", 3, "alice"); return err }, coordinator.ErrConflict},
		{"bad qty", func() error { _, err := c.Allocate(ctx, sku, "m-3", 0, "bob"); return err }, coordinator.ErrInvalidArgument},
		{"with a step", func() error {
			_, err := c.AllocateFunc(ctx, sku, "m-4", 1, "carol", func(context.Context) error { return nil })
			return err
		}, nil},
		{"release", func() error { _, err := c.Release(ctx, sku, "m-1"); return err }, nil},
		{"release again", func() error { _, err := c.Release(ctx, sku, "m-1"); return err }, nil},
		{"release unknown", func() error { _, err := c.Release(ctx, sku, "nope"); return err }, coordinator.ErrOrderNotFound},
		{"reserve", func() error { _, err := c.Reserve(ctx, sku, "r-1", 1, "dave", time.Hour); return err }, nil},
		{"confirm", func() error { _, err := c.Confirm(ctx, sku, "r-1"); return err }, nil},
		{"confirm again", func() error { _, err := c.Confirm(ctx, sku, "r-1"); return err }, nil},
		{"reserve to cancel", func() error { _, err := c.Reserve(ctx, sku, "r-2", 1, "erin", time.Hour); return err }, nil},
		{"cancel", func() error { _, err := c.Cancel(ctx, sku, "r-2"); return err }, nil},
		{"cancel a confirmed one", func() error { _, err := c.Cancel(ctx, sku, "r-1"); return err }, coordinator.ErrConflict},
		{"reserve to expire", func() error { _, err := c.Reserve(ctx, sku, "r-3", 2, "frank", time.Millisecond); return err }, nil},
		{"expire", func() error {
			// Past its deadline by a margin, by this clock: ExpireDue takes
			// the time to judge by.
			xs, err := engines.Of(c).Stock.ExpireDue(ctx, sku, time.Now().Add(time.Minute), 10)
			if err == nil && len(xs) != 1 {
				err = fmt.Errorf("expired %d reservations, want 1", len(xs))
			}
			return err
		}, nil},
		{"confirm an expired one", func() error { _, err := c.Confirm(ctx, sku, "r-3"); return err }, coordinator.ErrExpired},
		{"refill", func() error { _, _, err := engines.Of(c).Stock.Refill(ctx, sku, map[int]int64{0: 5}); return err }, nil},
		{"drain", func() (err error) { drained, _, err = engines.Of(c).Stock.Drain(ctx, sku, 3, time.Second); return err }, nil},
		// Last: on its way to the refusal, an order larger than a segment
		// may pull the pool into one (a move of kind pull).
		{"insufficient", func() error { _, err := c.Allocate(ctx, sku, "m-2", 1000, "bob"); return err }, errInsufficient},
	}
	for _, s := range steps {
		err := s.do()
		switch {
		case s.want == nil && err != nil:
			t.Fatalf("%s: %v", s.name, err)
		case s.want == errInsufficient:
			var ise *coordinator.InsufficientStockError
			if !errors.As(err, &ise) {
				t.Fatalf("%s: got %v, want an InsufficientStockError", s.name, err)
			}
		case s.want != nil && !errors.Is(err, s.want):
			t.Fatalf("%s: got %v, want %v", s.name, err, s.want)
		}
	}

	g := gather(t, reg)
	exact := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"stockctl_allocations_total", map[string]string{"op": "allocate", "outcome": "served", "source": "segment"}, 2},
		{"stockctl_allocations_total", map[string]string{"op": "allocate", "outcome": "replayed", "source": "none"}, 1},
		{"stockctl_allocations_total", map[string]string{"op": "allocate", "outcome": "conflict", "source": "none"}, 1},
		{"stockctl_allocations_total", map[string]string{"op": "allocate", "outcome": "insufficient", "source": "none"}, 1},
		{"stockctl_allocations_total", map[string]string{"op": "allocate", "outcome": "error", "source": "none"}, 1},
		{"stockctl_allocated_units_total", map[string]string{"source": "segment"}, 7}, // 2+1 allocated, 1+1+2 reserved
		{"stockctl_releases_total", map[string]string{"op": "release", "outcome": "released"}, 1},
		{"stockctl_releases_total", map[string]string{"op": "release", "outcome": "already_released"}, 1},
		{"stockctl_releases_total", map[string]string{"op": "release", "outcome": "not_found"}, 1},
		{"stockctl_allocations_total", map[string]string{"op": "reserve", "outcome": "served", "source": "segment"}, 3},
		{"stockctl_confirms_total", map[string]string{"outcome": "confirmed"}, 1},
		{"stockctl_confirms_total", map[string]string{"outcome": "replayed"}, 1},
		{"stockctl_confirms_total", map[string]string{"outcome": "expired"}, 1},
		{"stockctl_releases_total", map[string]string{"op": "cancel", "outcome": "released"}, 1},
		{"stockctl_releases_total", map[string]string{"op": "cancel", "outcome": "conflict"}, 1},
		{"stockctl_reservations_expired_total", nil, 1},
		{"stockctl_reservations_expired_units_total", nil, 2},
		{"stockctl_reservation_expiry_delay_seconds", nil, 1},
		{"stockctl_stock_moves_total", map[string]string{"kind": "refill"}, 1},
		{"stockctl_stock_moved_units_total", map[string]string{"kind": "refill"}, 5},
		{"stockctl_stock_moves_total", map[string]string{"kind": "drain"}, 1},
		{"stockctl_stock_moved_units_total", map[string]string{"kind": "drain"}, float64(drained)},
		{"stockctl_sessions_started_total", nil, 1},
		{"stockctl_session_losses_total", nil, 0},
	}
	for _, e := range exact {
		if got, ok := g.value(e.name, e.labels); !ok || got != e.want {
			t.Errorf("%s%v = %v (found %v), want %v", e.name, e.labels, got, ok, e.want)
		}
	}
	// Every group commit's round trip is timed and its batch size observed;
	// the served orders committed (the replay and the conflict were
	// refused by the order-ID compare and diagnosed).
	trips := g.sum("stockctl_commit_duration_seconds", nil)
	if n := g.sum("stockctl_commit_batch_orders", nil); n != trips || trips < 1 {
		t.Errorf("commit batches observed %v, commit round trips %v: want the same, ≥ 1", n, trips)
	}
	if n := g.sum("stockctl_commit_duration_seconds", map[string]string{"outcome": "committed"}); n < 1 || n > 5 {
		t.Errorf("committed group commits observed: %v, want 1 to 5 (two allocations and three reservations served)", n)
	}
	if n := g.sum("stockctl_commit_duration_seconds", map[string]string{"outcome": "refused"}); n < 2 {
		t.Errorf("refused group commits observed: %v, want ≥ 2 (the replay and the conflict)", n)
	}
	if n := g.sum("stockctl_lock_handoffs_total", map[string]string{"lock": "segment", "via": "etcd"}); n < 1 {
		t.Errorf("segment locks taken through etcd: %v, want ≥ 1", n)
	}
	if n := g.sum("stockctl_lock_wait_seconds", map[string]string{"lock": "pool", "outcome": "acquired"}); n < 2 {
		t.Errorf("pool lock waits (refill, drain): %v, want ≥ 2", n)
	}

	// The stock gauges are what etcd holds.
	st := mustStatus(t, c, sku)
	if got, ok := g.value("stockctl_stock_units", map[string]string{"sku": sku, "place": "pool"}); !ok || got != float64(st.Pool) {
		t.Errorf("pool gauge %v (found %v), status says %d", got, ok, st.Pool)
	}
	for _, s := range st.Segments {
		place := strconv.Itoa(s.Index)
		if got, ok := g.value("stockctl_stock_units", map[string]string{"sku": sku, "place": place}); !ok || got != float64(s.Remaining) {
			t.Errorf("segment %d gauge %v (found %v), status says %d", s.Index, got, ok, s.Remaining)
		}
	}

	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// errInsufficient marks a step that must fail with an
// *InsufficientStockError.
var errInsufficient = errors.New("insufficient stock")

// A lost session is counted (and logged); the next operation starts a new
// one, which is counted too.
func TestMetricsCountSessionLoss(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	reg := prometheus.NewRegistry()
	c, err := coordinator.New(etcd.Client(t), coordinator.WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sess, err := engines.Of(c).Locks.Session(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := etcd.Client(t).Revoke(t.Context(), sess.Lease()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sess.Done():
	case <-time.After(time.Minute):
		t.Fatal("the session did not end after its lease was revoked")
	}
	// sessionEnded runs right after Done; wait for its count, not a time.
	deadline := time.Now().Add(time.Minute)
	for {
		if v, _ := gather(t, reg).value("stockctl_session_losses_total", nil); v == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("stockctl_session_losses_total never reached 1")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := engines.Of(c).Locks.Session(t.Context()); err != nil {
		t.Fatal(err)
	}
	if v, _ := gather(t, reg).value("stockctl_sessions_started_total", nil); v != 2 {
		t.Errorf("sessions started: %v, want 2", v)
	}
}

// WithMetrics refuses a nil registerer; a second live coordinator cannot
// register the same names with one registry (New says so); Close
// unregisters, so a new coordinator can take the names over.
func TestMetricsRegistration(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	if _, err := coordinator.New(etcd.Client(t), coordinator.WithMetrics(nil)); !errors.Is(err, coordinator.ErrInvalidArgument) {
		t.Fatalf("WithMetrics(nil): got %v, want ErrInvalidArgument", err)
	}
	reg := prometheus.NewRegistry()
	a, err := coordinator.New(etcd.Client(t), coordinator.WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := coordinator.New(etcd.Client(t), coordinator.WithMetrics(reg)); err == nil {
		b.Close()
		t.Fatal("a second coordinator registered the same metrics with one registry")
	}
	a.Close()
	// Two coordinators in one registry: each wrapped with its own label. (A
	// fresh registry: one keeps the label names of a name it ever had.)
	shared := prometheus.NewRegistry()
	var both []*coordinator.Coordinator
	for _, name := range []string{"a", "b"} {
		wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"coordinator": name}, shared)
		c, err := coordinator.New(etcd.Client(t), coordinator.WithMetrics(wrapped))
		if err != nil {
			t.Fatalf("wrapped registerer %s: %v", name, err)
		}
		both = append(both, c)
	}
	if v, ok := gather(t, shared).value("stockctl_session_losses_total", map[string]string{"coordinator": "b"}); !ok || v != 0 {
		t.Errorf("coordinator b's series: %v, found %v", v, ok)
	}
	for _, c := range both {
		c.Close()
	}
	again, err := coordinator.New(etcd.Client(t), coordinator.WithMetrics(reg))
	if err != nil {
		t.Fatalf("after Close the names must be free again: %v", err)
	}
	again.Close()
}

// The stock gauges cover at most MetricsMaxSKUs SKUs: the most recently
// touched ones.
func TestMetricsStockGaugesAreBounded(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	reg := prometheus.NewRegistry()
	c, err := coordinator.New(etcd.Client(t), coordinator.WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := coordinator.MetricsMaxSKUs + 3
	for i := range n {
		sku := fmt.Sprintf("many-%02d", i)
		mustCreate(t, c, sku, coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10})
		if _, err := c.Allocate(t.Context(), sku, sku+"-o", 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	skus := map[string]bool{}
	for _, m := range gather(t, reg)["stockctl_stock_units"] {
		for _, l := range m.GetLabel() {
			if l.GetName() == "sku" {
				skus[l.GetValue()] = true
			}
		}
	}
	if len(skus) != coordinator.MetricsMaxSKUs {
		t.Fatalf("stock gauges cover %d SKUs, want %d", len(skus), coordinator.MetricsMaxSKUs)
	}
	for i := range 3 {
		if skus[fmt.Sprintf("many-%02d", i)] {
			t.Errorf("SKU many-%02d, touched longest ago, is still in the gauges", i)
		}
	}
}
