package coordinator

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/internal/lock"
	"github.com/stockctl/stockctl/segments"
)

// Defaults. Each is what the matching Option sets when not given.
const (
	// DefaultPrefix is the etcd key prefix all of a coordinator's keys live under.
	DefaultPrefix = "/stockctl/"

	// DefaultSessionTTL is the lease TTL of a coordinator's session. It is
	// renewed every third of the TTL while the process lives (the watchdog).
	// Cost: when a process dies or is cut off holding a lock, other
	// processes wait up to this long for it. Shorter TTLs free locks sooner
	// but turn shorter pauses (GC, network) into lost locks. etcd's minimum
	// is about 2 s (1.5 × its election timeout).
	DefaultSessionTTL = 10 * time.Second

	// DefaultCohortMaxHandoffs bounds how many times in a row a lock is handed
	// from one goroutine of this process to another without going back to
	// etcd. Local handoffs cost no round trip; the bound, with
	// DefaultCohortMaxHold, is what lets other processes' waiters in.
	DefaultCohortMaxHandoffs = 32

	// MaxCohortHandoffs is the largest cohort bound: a fencing token keeps
	// 16 bits for the holds a key is passed through (Lock.Token).
	MaxCohortHandoffs = lock.MaxCohortHandoffs

	// DefaultCohortMaxHold bounds how long this process keeps a lock's etcd
	// key through local handoffs. Once exceeded, the next unlock releases the
	// key and the local waiters queue in etcd behind other processes. It is
	// the extra wait a process's waiter can see beyond strict FIFO.
	DefaultCohortMaxHold = 100 * time.Millisecond

	// DefaultHomeWait bounds, with 4 × DefaultTenureMaxHold, how long a
	// process holding fewer than ⌊N/M⌋ of a SKU's N segments (M processes
	// selling it), with none free, queues in the background for a segment of
	// a process over its share. Orders do not wait for it: they go on down
	// the fallback ladder meanwhile.
	DefaultHomeWait = time.Second

	// DefaultFallbackWait is how long an order that this process's segments
	// cannot serve waits for the lock of each other place that holds its
	// quantity (another process's segment, or the pool for an order without
	// a business step) before trying the next, and last gathering from
	// several places.
	DefaultFallbackWait = 50 * time.Millisecond

	// DefaultMaxTxnOps is etcd's default --max-txn-ops. A group commit puts
	// two keys per order, so it bounds a group to about half of it.
	DefaultMaxTxnOps = 128

	// DefaultCommitTimeout bounds one group commit's round trips. The
	// commit does not use any one caller's ctx: it serves many callers.
	DefaultCommitTimeout = 10 * time.Second

	// DefaultTenureIdle is how long a process keeps a segment's lock (its
	// tenure) after its last order there, when nobody else wants it. A SKU
	// ordered now and then (a few orders a second spread over many
	// processes and SKUs) keeps its segments across the gaps between its
	// orders instead of paying two lock writes for nearly every order.
	// Cost: another process that queues for the segment gets it at once
	// (an idle tenure yields to a waiter), so the cost is only the keys
	// held: a process's idle SKUs keep their segments, and their memory
	// (reclaimed about 2 × this after the last order), this long.
	DefaultTenureIdle = 10 * time.Second

	// DefaultTenureMaxHold bounds how long a process keeps a segment another
	// process waits for while its own orders still want it and it holds no
	// more than its fair share of the SKU's segments (over its share, it
	// yields at once). The waiter gets the segment within this bound plus
	// the business step in progress and its commit. Shorter bounds move
	// segments between processes more often, each move costing a few etcd
	// writes.
	DefaultTenureMaxHold = 250 * time.Millisecond

	// DefaultReleaseTimeout bounds each attempt to delete a lock key after a
	// failed wait or a cancelled unlock; failed deletes are retried in the
	// background until they succeed or the session ends.
	DefaultReleaseTimeout = 5 * time.Second
)

type options struct {
	prefix            string
	sessionTTL        time.Duration
	cohortMaxHandoffs int
	cohortMaxHold     time.Duration
	releaseTimeout    time.Duration
	homeWait          time.Duration
	fallbackWait      time.Duration
	maxTxnOps         int
	commitTimeout     time.Duration
	tenureIdle        time.Duration
	tenureMaxHold     time.Duration
	lockDelay         time.Duration
	eagerSegments     bool // WithEagerSegments: direct orders rewrite their counters (lazy is the default)
	sellerSeat        bool // WithSellerSeat
	spaceGuard        float64
	logger            *slog.Logger
	metrics           prometheus.Registerer // nil: no metrics
	identity          string
	fleetCheckWait    time.Duration
	acrossTTL         time.Duration
}

func defaultOptions() options {
	return options{
		prefix:            DefaultPrefix,
		fleetCheckWait:    DefaultFleetCheckWait,
		acrossTTL:         DefaultAcrossTTL,
		sessionTTL:        DefaultSessionTTL,
		cohortMaxHandoffs: DefaultCohortMaxHandoffs,
		cohortMaxHold:     DefaultCohortMaxHold,
		releaseTimeout:    DefaultReleaseTimeout,
		homeWait:          DefaultHomeWait,
		fallbackWait:      DefaultFallbackWait,
		maxTxnOps:         DefaultMaxTxnOps,
		commitTimeout:     DefaultCommitTimeout,
		tenureIdle:        DefaultTenureIdle,
		tenureMaxHold:     DefaultTenureMaxHold,
		spaceGuard:        DefaultSpaceGuard,
		logger:            slog.New(slog.DiscardHandler),
		identity:          DefaultIdentity(),
	}
}

// DefaultIdentity is a coordinator's identity when WithIdentity is not
// given: "<hostname>/<pid>".
func DefaultIdentity() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}

// MaxIdentityLen is the longest identity WithIdentity accepts.
const MaxIdentityLen = 128

// WithIdentity names this coordinator (default DefaultIdentity(), its host
// and pid) where other processes see it: each lock key it puts in etcd, a
// named lock's or a segment's, carries the name as its value, so that
// `stockctl status --watch` and the lock listings say which instance holds
// a lock, not only its lease. 1 to MaxIdentityLen printable bytes; it costs
// those bytes in every lock key's value.
func WithIdentity(name string) Option {
	return func(o *options) error {
		if err := ValidateIdentity(name); err != nil {
			return err
		}
		o.identity = name
		return nil
	}
}

// ValidateIdentity checks a name for WithIdentity.
func ValidateIdentity(name string) error {
	if name == "" || len(name) > MaxIdentityLen {
		return fmt.Errorf("identity %q: must be 1 to %d bytes", name, MaxIdentityLen)
	}
	for i := 0; i < len(name); i++ {
		if name[i] < 0x20 || name[i] == 0x7f {
			return fmt.Errorf("identity %q: contains a control character", name)
		}
	}
	return nil
}

// Option configures a Coordinator. Options are validated by New, which
// returns an error naming the bad value.
type Option func(*options) error

// WithPrefix sets the etcd key prefix (default DefaultPrefix). Coordinators
// share locks and stock only when they use the same prefix. A trailing "/"
// is added when missing ("/shop" is "/shop/"), so that every key is under
// the prefix as a directory and a role limited to "/shop/" is enough.
func WithPrefix(prefix string) Option {
	return func(o *options) error {
		if _, err := keys.New(prefix); err != nil {
			return fmt.Errorf("prefix: %w", err)
		}
		o.prefix = prefix
		return nil
	}
}

// WithSessionTTL sets the session lease TTL (default DefaultSessionTTL). It
// must be a whole number of seconds, at least one second.
func WithSessionTTL(ttl time.Duration) Option {
	return func(o *options) error {
		if ttl < time.Second || ttl%time.Second != 0 {
			return fmt.Errorf("session TTL %v: must be a whole number of seconds, at least 1s", ttl)
		}
		o.sessionTTL = ttl
		return nil
	}
}

// WithCohort sets the bounds on local handoffs (defaults
// DefaultCohortMaxHandoffs and DefaultCohortMaxHold). maxHandoffs 0
// disables cohorting: every unlock goes back to etcd, and every shared hold
// (RLock) puts a key of its own. maxHandoffs is at most MaxCohortHandoffs.
// Shared holds join their process's key within maxHold only (the count
// bound does not apply to them: readers do not make other readers wait).
func WithCohort(maxHandoffs int, maxHold time.Duration) Option {
	return func(o *options) error {
		if maxHandoffs < 0 || maxHold < 0 || maxHandoffs > MaxCohortHandoffs {
			return fmt.Errorf("cohort bounds %d handoffs, %v: must not be negative, handoffs at most %d", maxHandoffs, maxHold, MaxCohortHandoffs)
		}
		o.cohortMaxHandoffs, o.cohortMaxHold = maxHandoffs, maxHold
		return nil
	}
}

// WithReleaseTimeout bounds each attempt to delete a lock key in cleanup
// (default DefaultReleaseTimeout).
func WithReleaseTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("release timeout %v: must be positive", d)
		}
		o.releaseTimeout = d
		return nil
	}
}

// WithLogger sets where the coordinator reports session losses and
// background cleanup failures (default: discarded).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return fmt.Errorf("logger is nil")
		}
		o.logger = l
		return nil
	}
}

// WithWaitBudgets sets how long a process below its fair share queues in
// the background for another process's segment (home, with 4 × the tenure's
// max hold; default DefaultHomeWait) and how long a falling-back order
// waits for each other place's lock (fallback, default
// DefaultFallbackWait).
func WithWaitBudgets(home, fallback time.Duration) Option {
	return func(o *options) error {
		if home < 0 || fallback < 0 {
			return fmt.Errorf("wait budgets %v, %v: must not be negative", home, fallback)
		}
		o.homeWait, o.fallbackWait = home, fallback
		return nil
	}
}

// WithMaxTxnOps tells the coordinator the etcd server's --max-txn-ops
// (default DefaultMaxTxnOps); group commits and SKU creation stay within it.
func WithMaxTxnOps(n int) Option {
	return func(o *options) error {
		if n < 8 {
			return fmt.Errorf("max txn ops %d: must be at least 8", n)
		}
		o.maxTxnOps = n
		return nil
	}
}

// WithTenure sets how long a process keeps a segment's lock after its last
// order there (idle, default DefaultTenureIdle) and how long it keeps one
// that another process waits for (maxHold, default DefaultTenureMaxHold).
func WithTenure(idle, maxHold time.Duration) Option {
	return func(o *options) error {
		if idle <= 0 || maxHold < 0 {
			return fmt.Errorf("tenure idle %v, max hold %v: idle must be positive, max hold not negative", idle, maxHold)
		}
		o.tenureIdle, o.tenureMaxHold = idle, maxHold
		return nil
	}
}

// WithMetrics registers the coordinator's Prometheus metrics with reg
// (prometheus.DefaultRegisterer, or a registry of your own); Close
// unregisters them. Without it nothing is counted and the hot path pays
// one nil check. Metric names start with stockctl_; see the package
// documentation's Metrics section for the list and their labels.
//
// Two live coordinators cannot register the same names with one registry:
// give each its own registry, or wrap reg for each with a label of its own,
// prometheus.WrapRegistererWith(prometheus.Labels{"coordinator": "a"}, reg)
// (all of them: one series set without the label would clash). A
// registration error makes New fail.
func WithMetrics(reg prometheus.Registerer) Option {
	return func(o *options) error {
		if reg == nil {
			return fmt.Errorf("metrics registerer is nil")
		}
		o.metrics = reg
		return nil
	}
}

// WithLockDelay sets a lock-delay (default none) for the named locks, shared
// holds and semaphore permits this coordinator acquires: if one of them is
// lost without being released (its lease expired or was revoked, its key
// deleted), nobody gets the lock for d (from the moment the next acquirer
// finds it so: at least d after the loss). It is for resources that cannot
// check a fencing token, and lets a holder that does not know it lost the
// lock finish within d. Every coordinator honours the delay, whatever its own
// option. Cost: one etcd write per acquisition through etcd (not per local
// handoff), and a record that stays in etcd after a loss until the lock's
// next acquirer removes it (P delays/...). d is at most MaxLockDelay.
func WithLockDelay(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 || d > MaxLockDelay {
			return fmt.Errorf("lock delay %v: must be 0 to %v", d, MaxLockDelay)
		}
		o.lockDelay = d
		return nil
	}
}

// MaxLockDelay bounds WithLockDelay (Consul's bound too).
const MaxLockDelay = time.Minute

// WithLazySegments makes this coordinator sell the plain orders of SKUs it
// holds no segment of (direct orders) lazily, which is the default since
// 27 November 2026 (WithEagerSegments turns it off). It takes the segment
// it sells from over once (one write: the counter names this coordinator;
// when the counter is exact and nobody's, that write is in the commit of
// the first order sold there), and from then on each order writes only
// its record, one etcd key, instead of its record and the segment's
// counter; the counter is written again only now and then (every 64
// orders, when the segment empties or falls below the low watermark, when
// it absorbs its inbox). A commit that carries 8 or more orders of one
// segment writes its counter exact and gives the ownership up instead: at
// that rate the write costs at most 1/8 key an order, and an exact counter
// spares every reader of the SKU the read of its records. Only an order
// without a route key takes a segment over (they all go to this
// coordinator's one direct home of the SKU); an order with a route key
// sells lazily from a segment this coordinator owns already, and eagerly
// elsewhere, so that buyers' homes spread over many segments never leave
// a lazy counter's base far behind the SKU's records, which every reader
// would read. Over many SKUs this roughly halves the keys etcd writes per
// order. Every reader counts
// such a segment as its counter less the records since its base (Status,
// Audit, the refusal's look, a lock holder taking the segment), so the
// books and every invariant stay as they are. Close writes the segments
// this coordinator sold lazily exact again.
//
// Almost every key such a sale writes is a live order record, which
// compaction cannot free: a database filled to its quota by them is
// recovered by the space reserve that `stockctl reclaim` releases (see
// docs/operations.md), or kept from filling by the space guard
// (WithSpaceGuard).
func WithLazySegments() Option {
	return func(o *options) error {
		o.eagerSegments = false
		return nil
	}
}

// WithEagerSegments makes this coordinator write a segment's counter with
// every direct order it sells there (two keys an order over many SKUs, its
// record and the counter), as stockctl did by default before 27 November
// 2026, instead of selling lazily (WithLazySegments). Every reader's
// count of a segment is then its counter alone while no other process
// sells it lazily. Processes of both kinds may sell one SKU side by side.
func WithEagerSegments() Option {
	return func(o *options) error {
		o.eagerSegments = true
		return nil
	}
}

// WithSellerSeat makes this coordinator announce itself as a seller when
// it is created (New waits for that, three round trips to etcd, up to 5
// s), rather
// than at its first order: pass it to the coordinators of a service that
// sells. Each selling process holds a seat (a small number, under a lease
// of its own), and a SKU's direct orders in a process start from the
// seat's home segment of the SKU. A SKU created while this coordinator
// holds its seat is then born with that home named to it (lazy segments,
// the default): its first order of the SKU writes only the order's record,
// where otherwise it would also write the segment's counter to take it
// over. Without it, the seat is claimed at the first order, and SKUs
// created before then are taken over as before. Admin tools (the stockctl
// CLI's one-shot commands) leave it out: a home named to a process that
// then exits is taken over by the next one, at the cost the option saves.
func WithSellerSeat() Option {
	return func(o *options) error {
		o.sellerSeat = true
		return nil
	}
}

// DefaultSpaceGuard is WithSpaceGuard's default share of etcd's quota.
const DefaultSpaceGuard = 0.95

// WithSpaceGuard sets the share of etcd's database quota
// (--quota-backend-bytes) over which this coordinator refuses new orders
// (Allocate, AllocateFunc, Reserve, AllocateOrder, ReserveOrder) with a
// *SpaceLowError, which matches ErrNoSpace: DefaultSpaceGuard (95 %) if
// not given; 0 turns the guard off. Retries of orders that were applied
// are still answered (replayed), and every other write (releases,
// cancels, confirms, the expiry sweep, the rebalancer, prune) goes on, so
// that prune can make room without etcd's NOSPACE alarm ever being raised:
// order records are live keys, which compaction cannot free. The guard
// reads each endpoint's database size and quota (etcd 3.6 and later
// report the quota; with older members it does nothing) once a second, and
// every 10 ms once the database is over 80 % of the line; the first order
// waits for the first reading (up to a second). fraction must be 0, or
// more than 0 and at most 1.
func WithSpaceGuard(fraction float64) Option {
	return func(o *options) error {
		if !(fraction >= 0 && fraction <= 1) {
			return fmt.Errorf("space guard %v: must be 0 (off), or more than 0 and at most 1", fraction)
		}
		o.spaceGuard = fraction
		return nil
	}
}

// WithFleetCheckWait bounds how long NewClusters waits for the clusters'
// fleet records (DefaultFleetCheckWait if not given); it must be more than
// 0. A cluster that has not answered by then is checked when first needed.
// New ignores it.
func WithFleetCheckWait(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("fleet check wait %v: must be more than 0", d)
		}
		o.fleetCheckWait = d
		return nil
	}
}

// WithAcrossTTL sets how long AllocateOrder over several clusters holds
// each cluster's lines as a reservation before it confirms them all
// (DefaultAcrossTTL if not given): if the process dies between the
// reserves and the confirms, the units are held until then, when the
// clusters' rebalancers expire them. More than 0, at most
// segments.MaxReservationTTL. New ignores it.
func WithAcrossTTL(d time.Duration) Option {
	return func(o *options) error {
		if err := segments.ValidateTTL(d); err != nil {
			return fmt.Errorf("across TTL: %w", err)
		}
		o.acrossTTL = d
		return nil
	}
}
