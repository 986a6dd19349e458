package cli

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/rebalance"
	"github.com/stockctl/stockctl/service"
)

// docs/metrics.md lists exactly the stockctl_* metrics the code registers
// (the coordinator's, the rebalancer's, the API's and serve's etcd
// gauges), each with exactly its labels.
func TestMetricsPageListsEveryMetric(t *testing.T) {
	t.Parallel()
	registered := registeredMetrics(t)
	raw, err := os.ReadFile("../../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `(stockctl_[a-z0-9_]+)` \\| [a-z]+ \\|([^|]*)\\|")
	label := regexp.MustCompile("`([a-z_]+)`")
	documented := map[string][]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if _, dup := documented[m[1]]; dup {
			t.Errorf("docs/metrics.md lists %s twice", m[1])
		}
		labels := []string{}
		for _, l := range label.FindAllStringSubmatch(m[2], -1) {
			labels = append(labels, l[1])
		}
		slices.Sort(labels)
		documented[m[1]] = labels
	}
	for name, labels := range registered {
		doc, ok := documented[name]
		switch {
		case !ok:
			t.Errorf("%s%v is registered but docs/metrics.md does not list it", name, labels)
		case !slices.Equal(doc, labels):
			t.Errorf("%s: docs/metrics.md lists labels %v, the code has %v", name, doc, labels)
		}
	}
	for name := range documented {
		if _, ok := registered[name]; !ok {
			t.Errorf("docs/metrics.md lists %s, which nothing registers", name)
		}
	}
}

// registeredMetrics are the stockctl_* metrics of a serve process, from
// the collectors' descriptions (a vector with no series yet counts), each
// with its label names, variable and constant, sorted.
func registeredMetrics(t *testing.T) map[string][]string {
	t.Helper()
	reg := &describingRegisterer{Registerer: prometheus.NewRegistry()}
	c, err := coordinator.New(shared.client, coordinator.WithPrefix(newEnv(t).prefix), coordinator.WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := rebalance.New(c, rebalance.Config{Identity: "metrics-doc"})
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(r.Collector(), newEtcdCollector(shared.client, []string{shared.endpoints}))
	s, err := service.New(c, service.Config{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	desc := regexp.MustCompile(`fqName: "([^"]+)".*constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}`)
	out := map[string][]string{}
	ch := make(chan *prometheus.Desc)
	go func() {
		for _, col := range reg.collectors {
			col.Describe(ch)
		}
		close(ch)
	}()
	for d := range ch {
		m := desc.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read %s", d)
		}
		labels := []string{}
		for _, part := range []string{m[2], m[3]} {
			for _, l := range strings.Split(part, ",") {
				if name, _, _ := strings.Cut(l, "="); name != "" {
					labels = append(labels, name)
				}
			}
		}
		slices.Sort(labels)
		out[m[1]] = labels
	}
	return out
}

// describingRegisterer remembers what was registered through it.
type describingRegisterer struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *describingRegisterer) Register(c prometheus.Collector) error {
	if err := r.Registerer.Register(c); err != nil {
		return err
	}
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *describingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}
