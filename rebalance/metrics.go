package rebalance

import (
	"github.com/prometheus/client_golang/prometheus"
)

// rebalancerMetrics is what a Rebalancer counts for Prometheus. It is
// always kept (a few atomic adds per move, off the order path) and exported
// only when the Collector is registered.
type rebalancerMetrics struct {
	leaderDesc   *prometheus.Desc
	watchingDesc *prometheus.Desc
	elections    prometheus.Counter
	terms        *prometheus.CounterVec // how a term ended
	failedMoves  prometheus.Counter
	refillLag    prometheus.Histogram
	moves        *prometheus.CounterVec // kind of move
}

func newRebalancerMetrics(identity string) *rebalancerMetrics {
	id := prometheus.Labels{"identity": identity}
	return &rebalancerMetrics{
		leaderDesc: prometheus.NewDesc("stockctl_rebalancer_leader",
			"1 while this process's rebalancer is the elected one, else 0.", nil, id),
		watchingDesc: prometheus.NewDesc("stockctl_rebalancer_watching",
			"1 while this rebalancer leads and its term's first pass (every SKU read and acted on) is done, else 0.", nil, id),
		elections: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockctl_rebalancer_elections_total", ConstLabels: id,
			Help: "Terms this rebalancer won (its leadership proven in etcd).",
		}),
		terms: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockctl_rebalancer_terms_ended_total", ConstLabels: id,
			Help: "Terms that ended, by how (resigned: stopped or done; lost: the session ended; error).",
		}, []string{"how"}),
		failedMoves: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockctl_rebalancer_failed_moves_total", ConstLabels: id,
			Help: "Moves the leader tried and that failed (retried on the next change or sweep).",
		}),
		refillLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "stockctl_rebalancer_refill_lag_seconds", ConstLabels: id,
			Help:    "From the leader seeing a segment cross its low watermark to the refill's commit.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockctl_rebalancer_moves_total", ConstLabels: id,
			Help: "Moves this rebalancer committed while leader (kind: refill, drain).",
		}, []string{"kind"}),
	}
}

// Collector exports the rebalancer's metrics: stockctl_rebalancer_leader
// (a gauge, 1 while elected), stockctl_rebalancer_watching (1 once the
// term's first pass is done: Watching), elections and ended terms, committed and
// failed moves, and the refill lag (from seeing a segment cross its low
// watermark to the refill's commit). Register it with your registry, next
// to the coordinator's (coordinator.WithMetrics). Its series carry the
// rebalancer's identity as a label.
func (r *Rebalancer) Collector() prometheus.Collector { return rebalancerCollector{r} }

type rebalancerCollector struct{ r *Rebalancer }

func (c rebalancerCollector) Describe(ch chan<- *prometheus.Desc) {
	m := c.r.metrics
	ch <- m.leaderDesc
	ch <- m.watchingDesc
	m.elections.Describe(ch)
	m.terms.Describe(ch)
	m.failedMoves.Describe(ch)
	m.refillLag.Describe(ch)
	m.moves.Describe(ch)
}

func (c rebalancerCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.r.metrics
	leader := 0.0
	if c.r.Leader() {
		leader = 1
	}
	ch <- prometheus.MustNewConstMetric(m.leaderDesc, prometheus.GaugeValue, leader)
	watching := 0.0
	if c.r.Watching() {
		watching = 1
	}
	ch <- prometheus.MustNewConstMetric(m.watchingDesc, prometheus.GaugeValue, watching)
	m.elections.Collect(ch)
	m.terms.Collect(ch)
	m.failedMoves.Collect(ch)
	m.refillLag.Collect(ch)
	m.moves.Collect(ch)
}
