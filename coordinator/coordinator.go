package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdcall"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/internal/lock"
	"github.com/stockctl/stockctl/segments"
)

// Coordinator is a process's handle on stockctl's locks and stock. Create one
// per etcd client and share it between all goroutines: it owns one etcd
// session (a lease renewed in the background) under which every lock of this
// process is held, and it queues this process's goroutines locally so that
// only one of them at a time owns a lock's etcd key.
//
// When the session is lost, every lock held under it is marked lost and
// every waiter fails with ErrSessionLost; the next call starts a new session.
type Coordinator struct {
	client  *clientv3.Client
	kv      clientv3.KV
	keys    keys.Space
	bg      *background.Group
	locks   *lock.Engine
	stock   *segments.Engine
	metrics prometheus.Collector // nil without WithMetrics
	reg     prometheus.Registerer
	// fleet is set on a coordinator over several clusters (NewClusters):
	// the fields above are then its first cluster's, and every SKU and
	// lock is routed to its own cluster's member. inFleet marks a member.
	fleet   *fleet
	inFleet bool
}

func init() {
	engines.Of = func(c any) engines.Engines {
		co := c.(*Coordinator)
		return engines.Engines{Client: co.client, KV: co.kv, Keys: co.keys, Locks: co.locks, Stock: co.stock}
	}
}

// New returns a coordinator using client. The client stays the caller's: Close
// the coordinator before the client. No etcd call is made until the first
// lock or stock operation. A bad option is an error wrapping
// ErrInvalidArgument that names the value.
func New(client *clientv3.Client, opts ...Option) (*Coordinator, error) {
	if client == nil {
		return nil, fmt.Errorf("coordinator: client is nil: %w", ErrInvalidArgument)
	}
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, fmt.Errorf("coordinator: %w: %w", ErrInvalidArgument, err)
		}
	}
	space, err := keys.New(o.prefix)
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w: %w", ErrInvalidArgument, err)
	}
	c := &Coordinator{client: client, kv: etcdcall.KV(client), keys: space, bg: background.NewGroup(), reg: o.metrics}
	var lm *lock.Metrics
	var sm *segments.Metrics
	if o.metrics != nil {
		lm, sm = lock.NewMetrics(), segments.NewMetrics()
	}
	c.locks = lock.New(client, c.kv, c.bg, lock.Config{
		SessionTTL:        o.sessionTTL,
		CohortMaxHandoffs: o.cohortMaxHandoffs,
		CohortMaxHold:     o.cohortMaxHold,
		ReleaseTimeout:    o.releaseTimeout,
		TenureIdle:        o.tenureIdle,
		LockDelay:         o.lockDelay,
		WatchPrefixes:     []string{space.LocksPrefix(), space.SemaphoresPrefix()},
		Logger:            o.logger,
		Metrics:           lm,
		Identity:          o.identity,
	})
	c.stock = segments.NewEngine(client, c.kv, c.locks, c.bg, segments.Config{
		Keys:          space,
		FallbackWait:  o.fallbackWait,
		ClaimWait:     o.homeWait,
		TenureMaxHold: o.tenureMaxHold,
		SellerIdle:    2 * o.tenureIdle,
		MaxTxnOps:     o.maxTxnOps,
		CommitTimeout: o.commitTimeout,
		LazySegments:  !o.eagerSegments,
		SeatAtStart:   o.sellerSeat,
		SpaceGuard:    o.spaceGuard,
		Logger:        o.logger,
		Metrics:       sm,
	})
	if o.metrics != nil {
		c.metrics = collectors(append(lm.Collectors(), sm))
		if err := o.metrics.Register(c.metrics); err != nil {
			c.bg.Stop()
			return nil, fmt.Errorf("coordinator: register metrics: %w", err)
		}
	}
	return c, nil
}

// Client is the etcd client the coordinator uses (over several clusters:
// the first cluster's).
func (c *Coordinator) Client() *clientv3.Client { return c.client }

// Prefix is the etcd key prefix the coordinator works under.
func (c *Coordinator) Prefix() string { return c.keys.Prefix() }

// closeSettleTimeout bounds Close's settling of the segments the
// coordinator sold lazily.
const closeSettleTimeout = 5 * time.Second

// Close releases every lock, revokes the session's lease and waits for the
// coordinator's background goroutines to end. Locks held at Close are lost
// (their cause is ErrClosed); waiters fail with ErrClosed. With lazy
// segments (the default; not WithEagerSegments) it then writes the exact
// units of the segments it sold lazily (one write per chunk of them,
// within a few seconds), so that the
// rebalancer, which reads counters, sees what they hold; an error there
// is returned, and the books are right either way. Close is idempotent.
// It does not close the etcd client.
func (c *Coordinator) Close() error {
	if c.fleet != nil {
		return c.fleet.close()
	}
	open, err := c.locks.Close()
	if !open {
		return nil
	}
	c.bg.Stop()
	c.bg.Wait()
	if c.metrics != nil {
		c.reg.Unregister(c.metrics)
	}
	if err != nil {
		err = fmt.Errorf("coordinator: close: revoke lease: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeSettleTimeout)
	defer cancel()
	if _, serr := c.stock.SettleOwned(ctx); serr != nil {
		err = errors.Join(err, fmt.Errorf("coordinator: close: %w (the books are right: readers count the records of a lazy segment)", serr))
	}
	return err
}

// collectors makes several collectors one, so that registering (and
// unregistering at Close) is one call.
type collectors []prometheus.Collector

func (cs collectors) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range cs {
		c.Describe(ch)
	}
}

func (cs collectors) Collect(ch chan<- prometheus.Metric) {
	for _, c := range cs {
		c.Collect(ch)
	}
}
