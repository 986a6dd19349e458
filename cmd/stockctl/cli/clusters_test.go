package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stockctl/stockctl/internal/etcdtest"
)

// The CLI over two clusters: init places a SKU where --cluster says (or
// by its name), list, status, audit and rebalance name the cluster that
// holds it, orders go there; processes whose --cluster lists disagree are
// refused; with one cluster stopped, the other's SKUs still sell and the
// stopped one's fail naming it.
func TestCLIClusters(t *testing.T) {
	a, b := etcdtest.NewSingle(t, etcdtest.WithNoFsync()), etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	prefix := "/clusters-cli/"
	fleet := []string{"--cluster", "a=" + a.Endpoints()[0], "--cluster", "b=" + b.Endpoints()[0], "--prefix", prefix, "--dial-timeout", "2s"}
	e := &env{t: t, prefix: prefix}
	okRun := func(args ...string) string {
		t.Helper()
		r := run(t, append(fleet, args...)...)
		if r.code != 0 {
			t.Fatalf("stockctl %s: exit %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
		}
		return r.stdout
	}
	var sv skuView
	decode(t, okRun("-o", "json", "init", "inb", "--total", "100", "--segments", "2", "--cluster", "b"), &sv)
	if sv.Cluster != "b" {
		t.Fatalf("init --cluster b: %+v", sv)
	}
	decode(t, okRun("-o", "json", "init", "ina", "--total", "100", "--segments", "2", "--initial-fill", "10", "--low-watermark", "8", "--refill-batch", "10", "--cluster", "a"), &sv)
	if sv.Cluster != "a" {
		t.Fatalf("init --cluster a: %+v", sv)
	}
	okRun("init", "hashed", "--total", "10", "--segments", "1")
	var l listView
	decode(t, okRun("-o", "json", "list"), &l)
	got := map[string]string{}
	for _, r := range l.SKUs {
		got[r.SKU] = r.Cluster
	}
	if len(l.SKUs) != 3 || got["inb"] != "b" || got["ina"] != "a" || got["hashed"] == "" || len(l.Revisions) != 2 {
		t.Fatalf("list: %+v", l)
	}
	if out := okRun("list"); !strings.Contains(out, "CLUSTER") {
		t.Fatalf("list table names no cluster:\n%s", out)
	}
	okRun("allocate", "inb", "--order", "o1", "--qty", "2")
	var st statusView
	decode(t, okRun("-o", "json", "status", "inb"), &st)
	if st.Cluster != "b" || st.Allocated != 2 {
		t.Fatalf("status inb: cluster %q, allocated %d", st.Cluster, st.Allocated)
	}
	var av auditView
	decode(t, okRun("-o", "json", "audit", "inb"), &av)
	if av.Cluster != "b" || !av.OK {
		t.Fatalf("audit inb: %+v", av)
	}
	if out := okRun("-o", "json", "orders", "inb", "--snapshot"); !strings.Contains(out, `"o1"`) {
		t.Fatalf("orders inb (cluster b) shows no o1:\n%s", out)
	}
	okRun("allocate", "ina", "--order", "o1", "--qty", "9")
	// The merged feed: every cluster's events, each line naming its
	// cluster and the merged cursor after it; resumed from a line's
	// cursor it prints exactly the lines after it.
	var evs []orderEventView
	for _, ln := range strings.Split(strings.TrimSpace(okRun("-o", "json", "orders", "--all")), "\n") {
		var v orderEventView
		decode(t, ln, &v)
		evs = append(evs, v)
	}
	inCl := map[string]bool{}
	for _, v := range evs {
		inCl[v.Cluster] = true
	}
	if len(evs) != 2 || !inCl["a"] || !inCl["b"] || evs[0].MergedCursor == "" {
		t.Fatalf("orders --all over two clusters: %+v", evs)
	}
	rest := strings.TrimSpace(okRun("-o", "json", "orders", "--all", "--since", evs[0].MergedCursor))
	var v orderEventView
	decode(t, rest, &v)
	if strings.Count(rest, "\n") != 0 || v.Order != evs[1].Order || v.Cluster != evs[1].Cluster {
		t.Fatalf("orders --all --since %s: %q, want only %+v", evs[0].MergedCursor, rest, evs[1])
	}
	// --snapshot: each cluster's orders in their state, then the events.
	snapCl := map[string]bool{}
	lastCursor := ""
	for _, ln := range strings.Split(strings.TrimSpace(okRun("-o", "json", "orders", "--all", "--snapshot")), "\n") {
		var v orderEventView
		decode(t, ln, &v)
		if !v.Snapshot {
			t.Fatalf("orders --all --snapshot: a line that is not the snapshot's: %s", ln)
		}
		snapCl[v.Cluster] = true
		if v.MergedCursor != "" {
			lastCursor = v.MergedCursor
		}
	}
	if !snapCl["a"] || !snapCl["b"] || !strings.Contains(lastCursor, "a=") || !strings.Contains(lastCursor, "b=") {
		t.Fatalf("orders --all --snapshot: clusters %v, last cursor %q", snapCl, lastCursor)
	}
	if r := run(t, append(fleet, "orders", "--all", "--since", "5")...); r.code != ExitUsage {
		t.Fatalf("orders --all --since 5 over two clusters: exit %d, %q", r.code, r.stderr)
	}
	var pv passView
	decode(t, okRun("-o", "json", "rebalance", "ina"), &pv)
	if len(pv.Moves) == 0 {
		t.Fatalf("rebalance ina (cluster a) made no move: %+v", pv)
	}
	okRun("lock", "some-lock", "--", "true")

	// Another order: refused.
	r := run(t, "--cluster", "b="+b.Endpoints()[0], "--cluster", "a="+a.Endpoints()[0], "--prefix", prefix, "list")
	if r.code == 0 || !strings.Contains(r.stderr, "does not match the fleet") {
		t.Fatalf("clusters in another order: exit %d, stderr %q", r.code, r.stderr)
	}
	// One cluster of the fleet given alone: refused, naming the fleet.
	r = run(t, "--endpoints", a.Endpoints()[0], "--prefix", prefix, "list")
	if r.code != ExitUsage || !strings.Contains(r.stderr, `cluster "a" of a fleet of clusters a,b`) {
		t.Fatalf("--endpoints on a fleet's cluster: exit %d, %q", r.code, r.stderr)
	}
	e.fails(ExitUsage, "not both", append([]string{"--cluster", "a=" + a.Endpoints()[0]}, "list")...)
	// The environment variable, ';'-separated.
	t.Setenv("STOCKCTL_CLUSTERS", "a="+a.Endpoints()[0]+";b="+b.Endpoints()[0])
	r = run(t, "--prefix", prefix, "-o", "json", "status", "inb")
	if r.code != 0 {
		t.Fatalf("status with STOCKCTL_CLUSTERS: exit %d, %q", r.code, r.stderr)
	}

	// Cluster b stopped: a's SKUs sell, b's fail naming it.
	b.Stop()
	okRun("allocate", "ina", "--order", "o2", "--qty", "1")
	r = run(t, append(fleet, "--timeout", "3s", "allocate", "inb", "--order", "o2", "--qty", "1")...)
	if r.code == 0 || !strings.Contains(r.stderr, `"b"`) {
		t.Fatalf("allocate on stopped cluster b: exit %d, stderr %q", r.code, r.stderr)
	}
}

// serve over two clusters: one rebalancer elected in each cluster refills
// that cluster's SKU, and the metrics say so per cluster, the etcd
// members' included.
func TestServeOverClusters(t *testing.T) {
	a, b := etcdtest.NewSingle(t, etcdtest.WithNoFsync()), etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	fleet := []string{"--cluster", "a=" + a.Endpoints()[0], "--cluster", "b=" + b.Endpoints()[0], "--prefix", "/serve-clusters/"}
	var out, errOut syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- runCtx(ctx, &out, &errOut, append(fleet, "serve", "--api-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--identity", "multi")...)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d: %s", code, errOut.String())
		}
	}()
	var url string
	etcdtest.WaitFor(t, "serve to say where its metrics are", 30*time.Second, func() bool {
		m := metricsLine.FindStringSubmatch(errOut.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	})
	for _, cl := range []string{"a", "b"} {
		if r := run(t, append(fleet, "init", "s"+cl, "--cluster", cl, "--total", "100", "--segments", "2", "--initial-fill", "10",
			"--low-watermark", "4", "--refill-batch", "20")...); r.code != 0 {
			t.Fatalf("init: %+v", r)
		}
		for i := range 3 {
			if r := run(t, append(fleet, "allocate", "s"+cl, "--order", fmt.Sprint("g", i), "--qty", "1", "--route-key", "same")...); r.code != 0 {
				t.Fatalf("allocate: %+v", r)
			}
		}
	}
	etcdtest.WaitFor(t, "a refill in each cluster, counted with its cluster label", time.Minute, func() bool {
		fams := scrape(t, url)
		va, _ := sample(fams, "stockctl_rebalancer_moves_total", map[string]string{"kind": "refill", "cluster": "a"})
		vb, _ := sample(fams, "stockctl_rebalancer_moves_total", map[string]string{"kind": "refill", "cluster": "b"})
		return va >= 1 && vb >= 1
	})
	fams := scrape(t, url)
	for _, cl := range []string{"a", "b"} {
		if v, ok := sample(fams, "stockctl_etcd_db_size_bytes", map[string]string{"cluster": cl}); !ok || v <= 0 {
			t.Errorf("stockctl_etcd_db_size_bytes{cluster=%s} = %v (found %v)", cl, v, ok)
		}
		if v, ok := sample(fams, "stockctl_rebalancer_leader", map[string]string{"cluster": cl}); !ok || v != 1 {
			t.Errorf("stockctl_rebalancer_leader{cluster=%s} = %v (found %v)", cl, v, ok)
		}
	}
}
