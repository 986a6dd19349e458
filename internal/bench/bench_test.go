package bench

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/stockctl/stockctl/internal/embedetcd"
	"github.com/stockctl/stockctl/segments"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startEtcd starts an embedded etcd for one test and returns n clients.
func startEtcd(t *testing.T, n int) []*clientv3.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	srv, err := embedetcd.Start(ctx, embedetcd.Config{Dir: t.TempDir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cs := make([]*clientv3.Client, n)
	for i := range cs {
		c, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs[i] = c
	}
	return cs
}

func TestEvenRouteKeys(t *testing.T) {
	for _, tc := range []struct{ buyers, n int }{{2, 1}, {40, 20}, {7, 3}, {200, 100}} {
		keys, err := evenRouteKeys(tc.buyers, tc.n)
		if err != nil {
			t.Fatal(err)
		}
		for b, k := range keys {
			if got := segments.Route(k, tc.n); got != b%tc.n {
				t.Fatalf("%d buyers on %d segments: buyer %d's key %q routes to %d", tc.buyers, tc.n, b, k, got)
			}
		}
	}
}

func TestProcess(t *testing.T) {
	spread := Params{Segments: 20, Processes: 4}
	seg := Params{Segments: 20, Processes: 4, Affinity: SegmentAffinity}
	for s := range 20 {
		// A segment's two buyers (s and s+20).
		if spread.Process(s) == spread.Process(s+20) {
			t.Errorf("spread: segment %d's buyers share process %d", s, spread.Process(s))
		}
		if seg.Process(s) != seg.Process(s+20) {
			t.Errorf("segment affinity: segment %d's buyers in processes %d and %d", s, seg.Process(s), seg.Process(s+20))
		}
	}
}

func TestBooksOversold(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    Books
		want int64
	}{
		{"balanced", Books{Stock: 100, Remaining: 60, Sold: 40}, 0},
		{"lost update", Books{Stock: 100, Remaining: 61, Sold: 40}, 1},
		{"below zero", Books{Stock: 100, Remaining: -2, Negative: 2, Sold: 102}, 2},
		{"unsold records missing", Books{Stock: 100, Remaining: 60, Sold: 39}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.b.Oversold(); got != tc.want {
				t.Fatalf("%+v: oversold %d, want %d", tc.b, got, tc.want)
			}
		})
	}
}

func TestSelect(t *testing.T) {
	all := []Spec{OneLock(), EtcdMutex(), Stockctl(), StockctlNoStep()}
	got, err := Select(all, []string{"stockctl", "one-lock"})
	if err != nil || len(got) != 2 || got[0].Name != "one-lock" || got[1].Name != "stockctl" {
		t.Fatalf("Select: %v %v", got, err)
	}
	if _, err := Select(all, []string{"redsync"}); !errors.Is(err, ErrUnknownStrategy) || !strings.Contains(err.Error(), "available: one-lock") {
		t.Fatalf("Select of an unknown name: %v", err)
	}
}

// leaky is a strategy that hands out stock it never deducts: the books must
// catch it.
type leaky struct{ sold atomic.Int64 }

func (l *leaky) Setup(context.Context, Params) error { return nil }
func (l *leaky) Buy(context.Context, int, string, int64, string) (bool, error) {
	l.sold.Add(1)
	time.Sleep(time.Millisecond)
	return false, nil
}
func (l *leaky) Verify(context.Context) (Books, error) {
	return Books{Stock: 10, Remaining: 10, Sold: l.sold.Load(), Orders: l.sold.Load()}, nil
}
func (l *leaky) Teardown(context.Context) error { return nil }

// Every strategy of this module on a real etcd: tiny runs that must balance
// their books, and a leaky strategy that must be caught.
func TestRun(t *testing.T) {
	cs := startEtcd(t, 2)
	specs := []Spec{OneLock(), EtcdMutex(), Stockctl(), StockctlNoStep(),
		{Name: "leaky", Title: "oversells", New: func() Strategy { return &leaky{} }}}
	var progress atomic.Int64
	rows, err := Run(t.Context(), Config{Specs: specs, Segments: []int{2}, Step: time.Millisecond, Duration: 300 * time.Millisecond,
		Orders: 2000, Processes: 2, Etcd: cs, Prefix: "/bench-test/", StopGrace: 2 * time.Second,
		Progress: func(Progress) { progress.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(specs) {
		t.Fatalf("%d rows for %d strategies", len(rows), len(specs))
	}
	for _, r := range rows {
		if r.Strategy == "leaky" {
			if r.OK || r.Oversold == 0 || len(r.Problems) == 0 {
				t.Errorf("the leaky strategy passed: %+v", r)
			}
			continue
		}
		if !r.OK || r.Oversold != 0 || r.Orders == 0 || r.OrdersPerSec <= 0 || r.Books.Sold < r.Orders {
			t.Errorf("%s: %+v", r.Strategy, r)
		}
		if step := r.Strategy != "stockctl-nostep"; step != (r.IdealPerSec > 0) || step != (r.ServiceMs.P99 > 0) {
			t.Errorf("%s: ideal %v, service %+v", r.Strategy, r.IdealPerSec, r.ServiceMs)
		}
	}
	if rows[0].Places != 1 || rows[0].IdealPerSec != 1000 || rows[1].Places != 2 || rows[1].IdealPerSec != 2000 {
		t.Errorf("places and ideals: %+v / %+v", rows[0], rows[1])
	}
	if progress.Load() == 0 {
		t.Error("no progress reported")
	}
	// Every run cleaned up after itself.
	resp, err := cs[0].Get(t.Context(), "/bench-test/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Errorf("%v keys left under the prefix (%v)", resp.Count, err)
	}
}

func TestRunInvalid(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Specs: []Spec{OneLock()}},
		{Specs: []Spec{OneLock()}, Segments: []int{0}, Prefix: "/x/", Processes: 1, Etcd: make([]*clientv3.Client, 1)},
		{Specs: []Spec{OneLock()}, Segments: []int{1}, Prefix: "/x/", Processes: 2, Etcd: make([]*clientv3.Client, 1)},
	} {
		if _, err := Run(t.Context(), cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}

func TestTargets(t *testing.T) {
	rows := []Row{
		{Strategy: "stockctl", Segments: 20, Buyers: 40, OrdersPerSec: 950, IdealPerSec: 1000, OfIdeal: 0.95, LatencyMs: Latency{P99: 58}},
		{Strategy: "redsync", Segments: 20, OrdersPerSec: 960, IdealPerSec: 1000},
		{Strategy: "stockctl", Segments: 100, OrdersPerSec: 3000, IdealPerSec: 5000, OfIdeal: 0.6},
		{Strategy: "stockctl-nostep", Segments: 20, OrdersPerSec: 4000},
		{Strategy: "redis-lua", Segments: 20, OrdersPerSec: 40000},
	}
	want := map[string]string{
		"20 segments: ≥ 0.90 of ideal":            TargetMet,
		"20 segments: ahead of redsync":           TargetNotMet,
		"20 segments: p99 ≤ 60 ms (end to end)":   TargetMet,
		"100 segments: ≥ 0.75 of ideal":           TargetNotMet,
		"pure allocation vs Redis Lua on one key": TargetMeasured,
	}
	got := Targets(rows)
	if len(got) != len(want) {
		t.Fatalf("targets %+v", got)
	}
	for _, tg := range got {
		if want[tg.Name] != tg.Status {
			t.Errorf("%s: %s, want %s (%s)", tg.Name, tg.Status, want[tg.Name], tg.Detail)
		}
	}
	if !strings.Contains(got[4].Detail, "0.100×") {
		t.Errorf("ratio: %s", got[4].Detail)
	}
}

func TestWriteSVG(t *testing.T) {
	rows := []Row{
		{Strategy: "one-lock", Segments: 1, Places: 1, StepMs: 20, OrdersPerSec: 40, IdealPerSec: 50},
		{Strategy: "one-lock", Segments: 20, Places: 1, StepMs: 20, OrdersPerSec: 45, IdealPerSec: 50},
		{Strategy: "stockctl", Segments: 1, Places: 1, StepMs: 20, OrdersPerSec: 45, IdealPerSec: 50},
		{Strategy: "stockctl", Segments: 20, Places: 20, StepMs: 20, OrdersPerSec: 900, IdealPerSec: 1000},
		{Strategy: "redis-lua", Segments: 20, Places: 1, OrdersPerSec: 40000},
	}
	var buf bytes.Buffer
	if err := WriteSVG(&buf, rows, "a <title> & more"); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(buf.Bytes()))
	lines := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("not well-formed XML: %v\n%s", err, buf.String())
			}
			break
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			lines++
		}
	}
	if lines != 4 { // the ideal and three strategies
		t.Fatalf("%d polylines, want 4\n%s", lines, buf.String())
	}
	for _, want := range []string{"a &lt;title&gt; &amp; more", ">10k<", ">stockctl<", ">redis-lua (no step)<", "ideal (segments ÷ step)"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the plot lacks %q", want)
		}
	}
}
