package segments

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockctl/stockctl/internal/lock"
)

// Metrics bounds. The stock gauges are the only metrics whose label values
// come from data (SKU names and segment indexes); these bound how many
// series they can make.
const (
	// MetricsMaxSKUs is how many SKUs the stock gauges cover: the ones this
	// process touched (allocated, released, refilled, drained) most
	// recently. With MaxSegments segments per SKU, the stock gauges are at
	// most MetricsMaxSKUs × (MaxSegments + 1) series; a typical sale (a
	// few hot SKUs, tens of segments) makes a few hundred.
	MetricsMaxSKUs = 32
	// MetricsSKUIdle drops a SKU from the stock gauges when this process
	// has not touched it for this long.
	MetricsSKUIdle = 10 * time.Minute
	// metricsStockReadTimeout bounds the etcd read made per SKU at scrape
	// time for the stock gauges.
	metricsStockReadTimeout = 2 * time.Second
)

// Metrics is what the segment engine counts for Prometheus (the
// coordinator's WithMetrics). A nil *Metrics counts nothing: every method is a no-op on nil, so the hot path
// pays one nil check without WithMetrics.
type Metrics struct {
	// Set by NewEngine: the stock gauges read the books at scrape time.
	status func(ctx context.Context, sku string) (*Status, error)
	bgCtx  func() context.Context
	log    *slog.Logger

	allocations   *prometheus.CounterVec // op, outcome, source
	units         *prometheus.CounterVec // source
	releases      *prometheus.CounterVec // op, outcome
	confirms      *prometheus.CounterVec // outcome
	expiries      prometheus.Counter
	expiredUnits  prometheus.Counter
	expiryDelay   prometheus.Histogram
	batchSize     prometheus.Histogram
	commitSeconds *prometheus.HistogramVec // outcome
	moves         *prometheus.CounterVec   // kind
	movedUnits    *prometheus.CounterVec   // kind
	moveSeconds   *prometheus.HistogramVec // kind, outcome

	stockDesc, stockReadErrDesc *prometheus.Desc
	stockReadErrors             atomic.Int64

	skuMu sync.RWMutex
	skus  map[string]*atomic.Int64 // SKU → when this process last touched it (unix nanos)
}

// commitBuckets span one fsynced etcd write on a fast disk to a slow one.
var commitBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// Move kinds, the kind label of the move metrics.
const (
	moveRefill = "refill"
	moveDrain  = "drain"
	movePull   = "pull"
)

// NewMetrics makes the segment engine's metrics; pass them in Config and
// register the Metrics itself (it is a prometheus.Collector).
func NewMetrics() *Metrics {
	return &Metrics{
		allocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockctl_allocations_total",
			Help: "Orders taking stock (op: allocate for Allocate/AllocateFunc, reserve for Reserve) by outcome (served, replayed, insufficient, limit_exceeded, conflict, pruned, error) and, when served, by source (segment, pool, gather; none otherwise).",
		}, []string{"op", "outcome", "source"}),
		units: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockctl_allocated_units_total",
			Help: "Units deducted by served allocations, by source (segment, pool, gather).",
		}, []string{"source"}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockctl_releases_total",
			Help: "Orders' stock given back (op: release or cancel) by outcome (released, already_released, expired, conflict, pruned, not_found, error).",
		}, []string{"op", "outcome"}),
		confirms: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockctl_confirms_total",
			Help: "Confirm calls by outcome (confirmed, replayed, expired, conflict, pruned, not_found, error).",
		}, []string{"outcome"}),
		expiries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockctl_reservations_expired_total",
			Help: "Reservations this process expired (the elected rebalancer's sweep, or a late Confirm).",
		}),
		expiredUnits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockctl_reservations_expired_units_total",
			Help: "Units that expired reservations gave back.",
		}),
		expiryDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "stockctl_reservation_expiry_delay_seconds",
			Help:    "From a reservation's deadline to its expiry's commit, by this process's clock.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "stockctl_commit_batch_orders",
			Help:    "Orders per group-commit transaction.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		}),
		commitSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stockctl_commit_duration_seconds",
			Help:    "Round trip of one group-commit transaction (outcome: committed, refused when a compare failed and the batch was diagnosed, error).",
			Buckets: commitBuckets,
		}, []string{"outcome"}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockctl_stock_moves_total",
			Help: "Stock moves this process committed, one per segment a move filled or emptied (kind: refill from the pool into a segment, drain of a segment into the pool, pull of pool stock into a segment this process sells from).",
		}, []string{"kind"}),
		movedUnits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockctl_stock_moved_units_total",
			Help: "Units moved by committed stock moves, by kind.",
		}, []string{"kind"}),
		moveSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stockctl_stock_move_duration_seconds",
			Help:    "Time one stock move took, its locks included (kind; outcome: moved, nothing, error).",
			Buckets: lock.LockWaitBuckets,
		}, []string{"kind", "outcome"}),
		stockDesc: prometheus.NewDesc("stockctl_stock_units",
			"Units left in a place of a SKU this process touched recently (place: pool, or a segment's index), read from etcd at scrape time.",
			[]string{"sku", "place"}, nil),
		stockReadErrDesc: prometheus.NewDesc("stockctl_stock_read_errors_total",
			"Scrapes that could not read a SKU's stock from etcd (its stockctl_stock_units were left out).", nil, nil),
		skus: make(map[string]*atomic.Int64),
	}
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.allocations, m.units, m.releases, m.confirms, m.expiries, m.expiredUnits, m.expiryDelay, m.batchSize, m.commitSeconds, m.moves, m.movedUnits, m.moveSeconds}
}

// Describe and Collect make the metrics one prometheus.Collector, so that
// registering (and unregistering at Close) is one call.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
	ch <- m.stockDesc
	ch <- m.stockReadErrDesc
}

func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
	m.collectStock(ch)
	ch <- prometheus.MustNewConstMetric(m.stockReadErrDesc, prometheus.CounterValue, float64(m.stockReadErrors.Load()))
}

// collectStock reads each recently touched SKU's stock (one etcd read per
// SKU, the same as Status) so the gauges are etcd's truth at scrape time,
// not this process's possibly stale view of places other processes sell.
func (m *Metrics) collectStock(ch chan<- prometheus.Metric) {
	for _, sku := range m.recentSKUs(time.Now()) {
		ctx, cancel := context.WithTimeout(m.bgCtx(), metricsStockReadTimeout)
		st, err := m.status(ctx, sku)
		cancel()
		if err != nil {
			m.stockReadErrors.Add(1)
			m.log.Debug("metrics: stock read failed", "sku", sku, "err", err)
			continue
		}
		ch <- prometheus.MustNewConstMetric(m.stockDesc, prometheus.GaugeValue, float64(st.Pool), sku, "pool")
		for _, s := range st.Segments {
			ch <- prometheus.MustNewConstMetric(m.stockDesc, prometheus.GaugeValue, float64(s.Remaining), sku, strconv.Itoa(s.Index))
		}
	}
}

// touch notes that this process used sku now, for the stock gauges. The
// common case (a SKU already known) takes a read lock and one atomic store.
func (m *Metrics) touch(sku string) {
	if m == nil {
		return
	}
	now := time.Now().UnixNano()
	m.skuMu.RLock()
	at, ok := m.skus[sku]
	m.skuMu.RUnlock()
	if ok {
		at.Store(now)
		return
	}
	m.skuMu.Lock()
	defer m.skuMu.Unlock()
	if at, ok := m.skus[sku]; ok {
		at.Store(now)
		return
	}
	if len(m.skus) >= MetricsMaxSKUs {
		// Forget the SKU touched longest ago.
		oldest, when := "", int64(0)
		for s, at := range m.skus {
			if t := at.Load(); oldest == "" || t < when {
				oldest, when = s, t
			}
		}
		delete(m.skus, oldest)
	}
	at = new(atomic.Int64)
	at.Store(now)
	m.skus[sku] = at
}

// recentSKUs lists the SKUs touched within MetricsSKUIdle, sorted, and
// forgets the others.
func (m *Metrics) recentSKUs(now time.Time) []string {
	m.skuMu.Lock()
	defer m.skuMu.Unlock()
	var out []string
	for s, at := range m.skus {
		if now.Sub(time.Unix(0, at.Load())) > MetricsSKUIdle {
			delete(m.skus, s)
			continue
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// allocated counts one Allocate/AllocateFunc (op "allocate") or Reserve
// (op "reserve") call's outcome.
func (m *Metrics) allocated(op, sku string, a *Allocation, err error) {
	if m == nil {
		return
	}
	m.touch(sku)
	var insufficient *InsufficientStockError
	switch {
	case err == nil && a.Replayed:
		m.allocations.WithLabelValues(op, "replayed", "none").Inc()
	case err == nil:
		src := "segment"
		switch {
		case len(a.Parts) > 1:
			src = "gather"
		case len(a.Parts) == 1 && a.Parts[0].Place.IsPool():
			src = "pool"
		}
		m.allocations.WithLabelValues(op, "served", src).Inc()
		m.units.WithLabelValues(src).Add(float64(a.Qty))
	case errors.As(err, &insufficient):
		m.allocations.WithLabelValues(op, "insufficient", "none").Inc()
	case errors.Is(err, ErrLimitExceeded):
		m.allocations.WithLabelValues(op, "limit_exceeded", "none").Inc()
	case errors.Is(err, ErrConflict):
		m.allocations.WithLabelValues(op, "conflict", "none").Inc()
	case errors.Is(err, ErrOrderPruned):
		m.allocations.WithLabelValues(op, "pruned", "none").Inc()
	default:
		m.allocations.WithLabelValues(op, "error", "none").Inc()
	}
}

// released counts one Release (op "release") or Cancel (op "cancel").
func (m *Metrics) released(op, sku string, r *Released, err error) {
	if m == nil {
		return
	}
	m.touch(sku)
	m.releases.WithLabelValues(op, returnOutcome(err, "released", "already_released", err == nil && !r.Released)).Inc()
}

// confirmed counts one Confirm call's outcome.
func (m *Metrics) confirmed(sku string, r *Confirmed, err error) {
	if m == nil {
		return
	}
	m.touch(sku)
	m.confirms.WithLabelValues(returnOutcome(err, "confirmed", "replayed", err == nil && r.Replayed)).Inc()
}

// returnOutcome labels a Release, Cancel or Confirm: done, or again when
// an earlier call had already done it, or what the error says.
func returnOutcome(err error, done, again string, repeated bool) string {
	switch {
	case err == nil && repeated:
		return again
	case err == nil:
		return done
	case errors.Is(err, ErrExpired):
		return "expired"
	case errors.Is(err, ErrConflict):
		return "conflict"
	case errors.Is(err, ErrOrderPruned):
		return "pruned"
	case errors.Is(err, ErrOrderNotFound):
		return "not_found"
	}
	return "error"
}

// expired counts the reservations an ExpireDue call expired, and each one's
// delay past its deadline.
func (m *Metrics) expired(sku string, xs []Expiry) {
	if m == nil || len(xs) == 0 {
		return
	}
	m.touch(sku)
	for _, x := range xs {
		m.expiries.Inc()
		m.expiredUnits.Add(float64(x.Qty))
		m.expiryDelay.Observe(max(0, x.At.Sub(x.Deadline).Seconds()))
	}
}

// committed counts one group-commit round trip of n orders.
func (m *Metrics) committed(n int, d time.Duration, outcome string) {
	if m == nil {
		return
	}
	m.batchSize.Observe(float64(n))
	m.commitSeconds.WithLabelValues(outcome).Observe(d.Seconds())
}

// moved counts one call of a stock move of kind: its duration once, and
// one move per segment it moved stock into or out of (moved maps a
// segment to its units; empty: nothing to move). A refill of three
// segments in one transaction is three moves, as the rebalancer counts
// them (stockctl_rebalancer_moves_total counts one Move per segment).
func (m *Metrics) moved(kind, sku string, moved map[int]int64, d time.Duration, err error) {
	if m == nil {
		return
	}
	m.touch(sku)
	outcome := "moved"
	switch {
	case err != nil:
		outcome = "error"
	case len(moved) == 0:
		outcome = "nothing"
	default:
		m.moves.WithLabelValues(kind).Add(float64(len(moved)))
		m.movedUnits.WithLabelValues(kind).Add(float64(sumMoved(moved)))
	}
	m.moveSeconds.WithLabelValues(kind, outcome).Observe(d.Seconds())
}

func sumMoved(moved map[int]int64) int64 {
	var n int64
	for _, q := range moved {
		n += q
	}
	return n
}
