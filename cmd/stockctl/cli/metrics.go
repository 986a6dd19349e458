package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	ucli "github.com/urfave/cli/v2"
)

func metricsAddrFlag() ucli.Flag {
	return &ucli.StringFlag{Name: "metrics-addr", EnvVars: []string{"STOCKCTL_METRICS_ADDR"},
		Usage: "serve Prometheus metrics on http://ADDRESS/metrics (host:port; port 0 picks a free one; default: none)"}
}

// metricsEndpoint serves /metrics for one command's coordinator and
// rebalancer. A nil *metricsEndpoint (no --metrics-addr) registers nothing.
type metricsEndpoint struct {
	reg  *prometheus.Registry
	srv  *http.Server
	addr string
	done chan error
}

// startMetrics listens on c's --metrics-addr, if set, and says where on w.
// The registry starts with the Go runtime's and the process's collectors;
// the coordinator (coordinator.WithMetrics) and the rebalancer (Collector)
// add theirs.
func startMetrics(c *ucli.Context, w io.Writer) (*metricsEndpoint, error) {
	addr := c.String("metrics-addr")
	if addr == "" {
		return nil, nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, usageError("invalid --metrics-addr %q: want host:port, e.g. 127.0.0.1:9090", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	// ContinueOnError: one collector's failure must not hide the others'
	// figures in the middle of a sale.
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	m := &metricsEndpoint{
		reg:  reg,
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		addr: ln.Addr().String(),
		done: make(chan error, 1),
	}
	go func() { m.done <- m.srv.Serve(ln) }()
	fmt.Fprintf(w, "metrics on http://%s/metrics\n", m.addr)
	return m, nil
}

// registerer is where the coordinator and the rebalancer register: nil
// without --metrics-addr.
func (m *metricsEndpoint) registerer() prometheus.Registerer {
	if m == nil {
		return nil
	}
	return m.reg
}

// close stops serving, letting a scrape in progress finish (briefly).
func (m *metricsEndpoint) close() {
	if m == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := m.srv.Shutdown(ctx); err != nil {
		_ = m.srv.Close()
	}
	if err := <-m.done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		_ = err // the listener was closed under it: nothing left to report
	}
}
