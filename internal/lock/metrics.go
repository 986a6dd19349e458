package lock

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics labels: the kind of a lock (the lock label) and how a hold was
// passed (the via label). Fixed sets, so the cardinality is fixed too.
const (
	KindSegment = "segment"
	KindPool    = "pool"
	// KindNamed is an exclusive named lock (the write side of a read-write
	// lock): the label it always had.
	KindNamed     = "named"
	KindShared    = "shared"
	KindSemaphore = "semaphore"

	viaLocal = "local"
	viaEtcd  = "etcd"
)

// LockWaitBuckets span a local handoff (tens of µs) to a wait budget's end
// and beyond; stock moves, which include lock waits, use them too.
var LockWaitBuckets = []float64{.0001, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// LockHoldBuckets span a critical section of a few µs to a job holding a
// lock for an hour.
var LockHoldBuckets = []float64{.0001, .001, .01, .1, 1, 10, 60, 600, 3600}

// Metrics is what the lock engine counts for Prometheus. A nil *Metrics
// counts nothing: every method is a no-op on nil, so the hot path pays one
// nil check without metrics.
type Metrics struct {
	lockWait      *prometheus.HistogramVec // lock, outcome
	lockHold      *prometheus.HistogramVec // lock, end
	holders       *prometheus.GaugeVec     // lock
	lockDelays    *prometheus.CounterVec   // lock
	handoffs      *prometheus.CounterVec   // lock, via
	sessions      prometheus.Counter
	sessionLosses prometheus.Counter
	lateRenewals  prometheus.Counter
}

// NewMetrics makes the lock engine's metrics; register Collectors().
func NewMetrics() *Metrics {
	return &Metrics{
		lockWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stockctl_lock_wait_seconds",
			Help:    "Time a goroutine waited to acquire a lock (lock: segment, pool, named (exclusive), shared or semaphore; outcome: acquired, busy, timeout, canceled, lost, error).",
			Buckets: LockWaitBuckets,
		}, []string{"lock", "outcome"}),
		lockHold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stockctl_lock_hold_seconds",
			Help:    "How long holds of named locks lasted (lock: named (exclusive), shared or semaphore; end: released or lost).",
			Buckets: LockHoldBuckets,
		}, []string{"lock", "end"}),
		holders: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stockctl_lock_holders",
			Help: "Holds of named locks in progress in this process (lock: named (exclusive), shared or semaphore).",
		}, []string{"lock"}),
		lockDelays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockctl_lock_delays_total",
			Help: "Acquisitions that waited out a lock-delay: a holder before them was lost without releasing.",
		}, []string{"lock"}),
		handoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockctl_lock_handoffs_total",
			Help: "Locks passed to a holder (via=local: from another goroutine of this process, no etcd write; via=etcd: acquired through etcd, from another process or free).",
		}, []string{"lock", "via"}),
		sessions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockctl_sessions_started_total",
			Help: "etcd sessions (leases) this coordinator started.",
		}),
		sessionLosses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockctl_session_losses_total",
			Help: "etcd sessions lost while in use: every lock held under one was lost.",
		}),
		lateRenewals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockctl_session_late_renewals_total",
			Help: "Session keepalives answered late: more than halfway from the longest healthy gap (granted TTL/3 + 0.5 s) to the granted TTL after the previous one (a step towards losing the session).",
		}),
	}
}

// Collectors are the metrics to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.lockWait, m.lockHold, m.holders, m.lockDelays, m.handoffs, m.sessions, m.sessionLosses, m.lateRenewals}
}

func (m *Metrics) lockWaited(kind string, d time.Duration, err error) {
	if m == nil {
		return
	}
	m.lockWait.WithLabelValues(kind, waitOutcome(err)).Observe(d.Seconds())
}

// waitOutcome classifies a lock wait's end.
func waitOutcome(err error) string {
	switch {
	case err == nil:
		return "acquired"
	case errors.Is(err, ErrLocked):
		return "busy"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, ErrSessionLost), errors.Is(err, ErrLost):
		return "lost"
	}
	return "error"
}

// Handoff counts a hold passed to a goroutine (from the stock layer's
// local slots too).
func (m *Metrics) handoff(kind, via string) {
	if m == nil {
		return
	}
	m.handoffs.WithLabelValues(kind, via).Inc()
}

func (m *Metrics) sessionStarted() {
	if m != nil {
		m.sessions.Inc()
	}
}

func (m *Metrics) sessionLost() {
	if m != nil {
		m.sessionLosses.Inc()
	}
}

func (m *Metrics) lateRenewal() {
	if m != nil {
		m.lateRenewals.Inc()
	}
}

// holdsCounted reports whether holds of kind are counted: those of named
// locks, not the stock layer's segment and pool holds (one per order; the
// stock metrics count those).
func (m *Metrics) holdsCounted(kind string) bool {
	return m != nil && (kind == KindNamed || kind == KindShared || kind == KindSemaphore)
}

func (m *Metrics) holdStarted(kind string) {
	m.holders.WithLabelValues(kind).Inc()
}

func (m *Metrics) holdEnded(kind string, d time.Duration, lost bool) {
	end := "released"
	if lost {
		end = "lost"
	}
	m.holders.WithLabelValues(kind).Dec()
	m.lockHold.WithLabelValues(kind, end).Observe(d.Seconds())
}

func (m *Metrics) lockDelayed(kind string) {
	if m != nil {
		m.lockDelays.WithLabelValues(kind).Inc()
	}
}
