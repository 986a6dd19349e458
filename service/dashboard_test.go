package service_test

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/rebalance"
	"github.com/stockctl/stockctl/service"
)

// dashboardPath is the Grafana dashboard shipped for `stockctl serve`.
const dashboardPath = "../docs/grafana/stockctl.json"

// Every metric the Grafana dashboard queries exists: exported by the
// coordinator (WithMetrics), the rebalancer (Collector) or the service.
func TestDashboardQueriesExistingMetrics(t *testing.T) {
	t.Parallel()
	known := knownMetrics(t)
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	name := regexp.MustCompile(`stockctl_[a-z0-9_]+`)
	queried := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range name.FindAllString(tg.Expr, -1) {
				queried++
				if !known[m] && !known[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")] {
					t.Errorf("panel %q queries %s, which nothing exports", p.Title, m)
				}
			}
		}
	}
	if queried == 0 {
		t.Fatal("the dashboard queries no stockctl metric")
	}
}

// knownMetrics are the metric names a `stockctl serve` process exports, from
// the collectors' descriptions (so a vector with no series yet counts).
func knownMetrics(t *testing.T) map[string]bool {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	rec := &recordingRegisterer{Registerer: prometheus.NewRegistry()}
	c, err := coordinator.New(etcd.Client(t), coordinator.WithMetrics(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := rebalance.New(c, rebalance.Config{Identity: "dashboard-test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Register(r.Collector()); err != nil {
		t.Fatal(err)
	}
	s, err := service.New(c, service.Config{Registerer: rec})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	known := map[string]bool{}
	ch := make(chan *prometheus.Desc)
	go func() {
		for _, col := range rec.collectors {
			col.Describe(ch)
		}
		close(ch)
	}()
	for d := range ch {
		if m := fq.FindStringSubmatch(d.String()); m != nil {
			known[m[1]] = true
		}
	}
	names := make([]string, 0, len(known))
	for n := range known {
		names = append(names, n)
	}
	sort.Strings(names)
	t.Logf("%d metric families exported: %s", len(names), strings.Join(names, " "))
	return known
}

// recordingRegisterer remembers what was registered through it.
type recordingRegisterer struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	if err := r.Registerer.Register(c); err != nil {
		return err
	}
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}
