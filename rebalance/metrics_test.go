package rebalance_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
)

// metricOf reads one series of a gathered family by label.
func metricOf(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			ok := label == ""
			for _, l := range m.GetLabel() {
				ok = ok || (l.GetName() == label && l.GetValue() == value)
			}
			if !ok {
				continue
			}
			if m.Gauge != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// The leader gauge follows leadership: 1 on the elected rebalancer, 0 on
// the other (and so does the watching gauge, once the leader's first pass
// is done); when the leader's session is lost its term is counted as lost
// and the other rebalancer is elected (and counts it). The names pass
// Prometheus's lint.
func TestRebalancerMetricsFollowLeadership(t *testing.T) {
	etcd := etcdtest.NewSingle(t)
	ca, cb := newCoordinator(t, etcd), newCoordinator(t, etcd)
	ra, _ := startRebalancer(t, ca, rebalance.Config{Identity: "a"})
	etcdtest.WaitFor(t, "a to lead", 30*time.Second, ra.Leader)
	rb, _ := startRebalancer(t, cb, rebalance.Config{Identity: "b"})
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	regA.MustRegister(ra.Collector())
	regB.MustRegister(rb.Collector())

	if g := metricOf(t, regA, "stockctl_rebalancer_leader", "identity", "a"); g != 1 {
		t.Fatalf("a's leader gauge %v, want 1", g)
	}
	if g := metricOf(t, regB, "stockctl_rebalancer_leader", "identity", "b"); g != 0 {
		t.Fatalf("b's leader gauge %v, want 0", g)
	}
	etcdtest.WaitFor(t, "a's first pass", 30*time.Second, ra.Watching)
	if a, b := metricOf(t, regA, "stockctl_rebalancer_watching", "identity", "a"), metricOf(t, regB, "stockctl_rebalancer_watching", "identity", "b"); a != 1 || b != 0 {
		t.Fatalf("watching gauges a %v, b %v; want 1 and 0", a, b)
	}

	// Lose a's session: its lease revoked in etcd.
	sess, err := engines.Of(ca).Locks.Session(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := etcd.Client(t).Revoke(t.Context(), sess.Lease()); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, "b to lead", 30*time.Second, rb.Leader)
	etcdtest.WaitFor(t, "a's lost term to be counted", 30*time.Second, func() bool {
		return metricOf(t, regA, "stockctl_rebalancer_terms_ended_total", "how", "lost") == 1
	})
	if g := metricOf(t, regB, "stockctl_rebalancer_leader", "identity", "b"); g != 1 {
		t.Errorf("b's leader gauge %v after the failover, want 1", g)
	}
	etcdtest.WaitFor(t, "b's first pass", 30*time.Second, rb.Watching)
	if a, b := metricOf(t, regA, "stockctl_rebalancer_watching", "identity", "a"), metricOf(t, regB, "stockctl_rebalancer_watching", "identity", "b"); a != 0 || b != 1 {
		t.Errorf("watching gauges after the failover a %v, b %v; want 0 and 1", a, b)
	}
	if n := metricOf(t, regB, "stockctl_rebalancer_elections_total", "", ""); n != 1 {
		t.Errorf("b's elections %v, want 1", n)
	}
	for _, reg := range []*prometheus.Registry{regA, regB} {
		problems, err := testutil.GatherAndLint(reg)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}

// The coordinator's and the rebalancer's move counters count the same
// thing, one move per segment: a pass that refills five segments in one
// transaction is five moves in both, with the same units (the
// coordinator's used to count the transaction once).
func TestMoveCountersAgree(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	reg := prometheus.NewRegistry()
	c := newCoordinator(t, etcd, coordinator.WithMetrics(reg))
	if _, err := c.CreateSKU(t.Context(), "m", coordinator.SKUConfig{Total: 50, Segments: 5, RefillBatch: 3}); err != nil {
		t.Fatal(err)
	}
	r, err := rebalance.New(c, rebalance.Config{Identity: "once"})
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(r.Collector())
	pass, err := r.RunOnce(t.Context(), "m")
	if err != nil {
		t.Fatal(err)
	}
	if len(pass.Moves) != 5 {
		t.Fatalf("pass %+v, want a refill of each of 5 segments", pass)
	}
	stock := metricOf(t, reg, "stockctl_stock_moves_total", "kind", "refill")
	reb := metricOf(t, reg, "stockctl_rebalancer_moves_total", "kind", "refill")
	units := metricOf(t, reg, "stockctl_stock_moved_units_total", "kind", "refill")
	if stock != 5 || reb != 5 || units != 15 {
		t.Fatalf("stockctl_stock_moves_total{refill} %v, stockctl_rebalancer_moves_total{refill} %v, units %v: want 5, 5, 15", stock, reb, units)
	}
}
