package cli

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// scrape reads url's metrics and parses them as Prometheus's text format.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape %s: %s: %s", url, resp.Status, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse the scrape of %s: %v", url, err)
	}
	return fams
}

// sample is the value of the series of fam whose labels include labels
// (counters, gauges; a histogram's count), or false.
func sample(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		for k, v := range labels {
			found := false
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == k && l.GetValue() == v)
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

var metricsLine = regexp.MustCompile(`metrics on (http://\S+/metrics)`)

// serve --metrics-addr exposes the served rebalancer's and coordinator's
// metrics: a scrape parses, says who leads, counts the refills it made and
// reports the stock etcd holds.
func TestServeMetrics(t *testing.T) {
	t.Parallel()
	srv := startServe(t, "metered", "--metrics-addr", "127.0.0.1:0")
	m := metricsLine.FindStringSubmatch(srv.errOut.String())
	if m == nil {
		t.Fatalf("serve did not say where its metrics are:\n%s", srv.errOut.String())
	}
	url := m[1]
	srv.ok(t, "init", "gauge", "--total", "100", "--segments", "2", "--initial-fill", "10", "--low-watermark", "4", "--refill-batch", "20")
	// 3 single units from one segment of 5: it falls below its watermark
	// of 4 while it can still serve every order, so no seller pulls from
	// the pool and the refill is the served rebalancer's.
	for i := range 3 {
		srv.ok(t, "allocate", "gauge", "--order", fmt.Sprintf("g%d", i), "--qty", "1", "--route-key", "same")
	}
	var fams map[string]*dto.MetricFamily
	etcdtest.WaitFor(t, "a refill counted in the served metrics", 30*time.Second, func() bool {
		fams = scrape(t, url)
		v, _ := sample(fams, "stockctl_rebalancer_moves_total", map[string]string{"kind": "refill"})
		return v >= 1
	})
	if v, ok := sample(fams, "stockctl_rebalancer_leader", map[string]string{"identity": "metered"}); !ok || v != 1 {
		t.Errorf("stockctl_rebalancer_leader = %v (found %v), want 1", v, ok)
	}
	if v, ok := sample(fams, "stockctl_stock_moves_total", map[string]string{"kind": "refill"}); !ok || v < 1 {
		t.Errorf("stockctl_stock_moves_total{kind=refill} = %v (found %v), want ≥ 1", v, ok)
	}
	if _, ok := fams["go_goroutines"]; !ok {
		t.Error("no Go runtime metrics")
	}
	// The embedded etcd's space, for alerts before it is full.
	if v, ok := sample(fams, "stockctl_etcd_quota_backend_bytes", nil); !ok || v <= 0 {
		t.Errorf("stockctl_etcd_quota_backend_bytes = %v (found %v), want etcd's quota", v, ok)
	}
	if v, ok := sample(fams, "stockctl_etcd_db_size_bytes", nil); !ok || v <= 0 {
		t.Errorf("stockctl_etcd_db_size_bytes = %v (found %v)", v, ok)
	}
	// The stock gauges are etcd's figures: quiet now, they equal status.
	var st statusView
	decode(t, srv.ok(t, "-o", "json", "status", "gauge"), &st)
	fams = scrape(t, url)
	if v, ok := sample(fams, "stockctl_stock_units", map[string]string{"sku": "gauge", "place": "pool"}); !ok || v != float64(st.Pool) {
		t.Errorf("pool gauge %v (found %v), status says %d", v, ok, st.Pool)
	}

	srv.stop(t)
	if _, err := http.Get(url); err == nil {
		t.Error("the metrics endpoint still answers after serve stopped")
	}
}

// A bad --metrics-addr, or one where nothing would be served, is a usage
// error that starts nothing.
func TestMetricsAddrUsage(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "unused.etcd")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--listen", freeAddr(t), "--metrics-addr", "9090"}, "invalid --metrics-addr"},
		{[]string{"rebalance", "--watch", "--metrics-addr", "localhost"}, "invalid --metrics-addr"},
		{[]string{"rebalance", "sku", "--metrics-addr", "127.0.0.1:0"}, "use it with --watch"},
	} {
		args := append([]string{"--data-dir", dir}, tc.args...)
		checkFails(t, run(t, args...), ExitUsage, tc.want, args)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a usage error started the embedded etcd: %s exists (%v)", dir, err)
	}
}
