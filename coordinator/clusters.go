package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/connectivity"

	"github.com/stockctl/stockctl/segments"
)

// A coordinator over several etcd clusters (NewClusters) is a fleet of
// one-cluster coordinators, its members, one per cluster: each has its own
// session, lock engine and segment engine, so every transaction, fence and
// invariant stays inside one cluster's Raft group. The facade routes each
// SKU to the cluster it was placed in (placement.go) and each named lock to
// the cluster its name hashes to (over the fleet's lock clusters), and
// checks the fleet records (fleet.go). docs/clusters.md describes the
// protocol and why it never splits a SKU.

// Cluster is one named etcd cluster of a coordinator over several.
type Cluster struct {
	// Name is the cluster's name: 1 to 64 bytes of [A-Za-z0-9._-]. It is
	// recorded in the cluster (its fleet record), and a SKU's placement
	// names it, so it must stay the same for the cluster's life.
	Name string
	// Client is the cluster's etcd client; it stays the caller's (close it
	// after the coordinator).
	Client *clientv3.Client
}

// DefaultFleetCheckWait bounds how long NewClusters waits for each
// cluster's fleet record. A cluster that does not answer by then is checked
// again when an operation first needs it; NewClusters returns without it.
const DefaultFleetCheckWait = 5 * time.Second

// ErrClusterUnavailable is matched (errors.Is) by errors of an operation
// that needed a cluster it could not reach: the *ClusterError names it.
var ErrClusterUnavailable = errors.New("etcd cluster unavailable")

// ErrFleetMismatch is matched by errors of a coordinator whose cluster
// list does not agree with the fleet records in etcd (another list, other
// order, a cluster's endpoints reaching another named cluster, a SKU in a
// cluster that joins the fleet).
var ErrFleetMismatch = errors.New("cluster list does not match the fleet")

// ClusterError is an error of one cluster of a coordinator over several:
// it names the cluster. Unavailable says the cluster could not be reached
// (errors.Is(err, ErrClusterUnavailable)); otherwise Err is the operation's
// own error (ErrInsufficientStock, ErrUnknownSKU ...), which errors.Is and
// errors.As reach through Unwrap.
type ClusterError struct {
	Cluster     string
	Unavailable bool
	Err         error
}

func (e *ClusterError) Error() string {
	if e.Unavailable {
		return fmt.Sprintf("etcd cluster %q is unavailable: %v", e.Cluster, e.Err)
	}
	return fmt.Sprintf("cluster %q: %v", e.Cluster, e.Err)
}

func (e *ClusterError) Unwrap() error { return e.Err }

// Is makes an unavailable cluster's error match ErrClusterUnavailable.
func (e *ClusterError) Is(target error) bool { return target == ErrClusterUnavailable && e.Unavailable }

// fleet is the state of a coordinator over several clusters.
type fleet struct {
	members []*member // in the configured order; members[0] is the registry
	byName  map[string]*member
	names   []string
	// checkWait bounds the fleet check of NewClusters.
	checkWait time.Duration
	// acrossTTL is the reservations' TTL of AllocateOrder over several
	// clusters (orders_fleet.go).
	acrossTTL time.Duration

	// ctx ends at Close; wg counts the lookups' goroutines that outlive
	// their caller.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// gate serialises fleet checks (a 1-slot semaphore, so a waiter can
	// give up when its ctx ends).
	gate chan struct{}

	mu      sync.Mutex
	locks   []string           // the lock clusters, from the fleet records; nil until known
	removed map[string]removal // the registry's removal records, as last read (remove.go)
	placed  map[string]*member // the placement cache: SKU → its cluster
	splitAt map[string]string  // SKUs found in two clusters: the message
}

// member is one cluster of a fleet.
type member struct {
	name string
	c    *Coordinator // a one-cluster coordinator on the cluster's client

	mu      sync.Mutex
	checked bool // its fleet record agrees with this process

	probeMu sync.Mutex // held across the probe's read, and alone
	probeAt time.Time
	probeOK bool
}

// NewClusters returns a coordinator over several etcd clusters, in the
// order given: the first is the fleet's registry (where SKU names are
// claimed), and the order is recorded in every cluster's fleet record, so
// every process of the fleet must name the same clusters in the same
// order (a process may add clusters at the end: see docs/clusters.md).
// Options apply to every cluster's member; WithMetrics' metrics carry a
// "cluster" label.
//
// It reads (and on first use writes) each cluster's fleet record, waiting
// at most WithFleetCheckWait (DefaultFleetCheckWait) or until ctx ends: a
// record that disagrees with clusters is an error wrapping
// ErrFleetMismatch, and nothing is left running. A cluster that does not
// answer is checked when an operation first needs it; until then its SKUs
// and locks fail with an error naming it (ErrClusterUnavailable), and the
// others serve. New(client) stays the one-cluster coordinator.
func NewClusters(ctx context.Context, clusters []Cluster, opts ...Option) (*Coordinator, error) {
	if len(clusters) == 0 {
		return nil, fmt.Errorf("coordinator: no cluster: %w", ErrInvalidArgument)
	}
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, fmt.Errorf("coordinator: %w: %w", ErrInvalidArgument, err)
		}
	}
	f := &fleet{byName: map[string]*member{}, gate: make(chan struct{}, 1), placed: map[string]*member{},
		splitAt: map[string]string{}, checkWait: o.fleetCheckWait, acrossTTL: o.acrossTTL}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	for _, cl := range clusters {
		if err := validateClusterName(cl.Name); err != nil {
			return nil, fmt.Errorf("coordinator: %w", err)
		}
		if cl.Client == nil {
			return nil, fmt.Errorf("coordinator: cluster %q: client is nil: %w", cl.Name, ErrInvalidArgument)
		}
		if f.byName[cl.Name] != nil {
			return nil, fmt.Errorf("coordinator: cluster %q named twice: %w", cl.Name, ErrInvalidArgument)
		}
		mopts := slices.Clone(opts)
		if o.metrics != nil {
			reg := prometheus.WrapRegistererWith(prometheus.Labels{"cluster": cl.Name}, o.metrics)
			mopts = append(mopts, WithMetrics(reg))
		}
		mc, err := New(cl.Client, mopts...)
		if err != nil {
			f.close()
			return nil, fmt.Errorf("coordinator: cluster %q: %w", cl.Name, err)
		}
		mc.inFleet = true
		m := &member{name: cl.Name, c: mc}
		f.members = append(f.members, m)
		f.byName[cl.Name] = m
		f.names = append(f.names, cl.Name)
	}
	f.installDeciders()
	cctx, cancel := context.WithTimeout(ctx, f.checkWait)
	defer cancel()
	if err := f.check(cctx); err != nil && errors.Is(err, ErrFleetMismatch) {
		f.close()
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	first := f.members[0].c
	return &Coordinator{client: first.client, kv: first.kv, keys: first.keys, bg: first.bg, locks: first.locks,
		stock: first.stock, fleet: f}, nil
}

// validateClusterName checks a cluster's name.
func validateClusterName(name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("cluster name %q: %w: 1 to 64 bytes", name, ErrInvalidArgument)
	}
	for i := 0; i < len(name); i++ {
		b := name[i]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '.' || b == '_' || b == '-') {
			return fmt.Errorf("cluster name %q: %w: only letters, digits, '.', '_' and '-' (not %s)", name,
				ErrInvalidArgument, segments.DescribeByte(name, i))
		}
	}
	return nil
}

// Clusters names the clusters of a coordinator over several, in their
// order (the first is the registry); nil for a one-cluster coordinator.
func (c *Coordinator) Clusters() []string {
	if c.fleet == nil {
		return nil
	}
	return slices.Clone(c.fleet.names)
}

// Cluster returns the one-cluster coordinator of the named cluster of a
// coordinator over several (nil if there is none): for what runs per
// cluster, such as a rebalancer (rebalance.New(c.Cluster(name), ...)),
// which is elected per cluster. Its CreateSKU is refused (a SKU is created
// through the fleet, which places it); closing it is the fleet's job.
func (c *Coordinator) Cluster(name string) *Coordinator {
	if c.fleet == nil || c.fleet.byName[name] == nil {
		return nil
	}
	return c.fleet.byName[name].c
}

// ClusterOf names the cluster that holds sku ("" for a one-cluster
// coordinator, without a read). It reads every cluster each time (the
// cache the stock operations use may name a cluster the SKU has moved
// from; they find out at their next call, ClusterOf's callers would not):
// call it once per SKU, not per order.
func (c *Coordinator) ClusterOf(ctx context.Context, sku string) (string, error) {
	if c.fleet == nil {
		return "", nil
	}
	m, err := c.fleet.locate(ctx, sku)
	if err != nil {
		return "", err
	}
	return m.name, nil
}

// close ends the lookups and closes every member.
func (f *fleet) close() error {
	f.cancel()
	f.wg.Wait()
	var errs []error
	for _, m := range f.members {
		if err := m.c.Close(); err != nil {
			errs = append(errs, fmt.Errorf("cluster %q: %w", m.name, err))
		}
	}
	return errors.Join(errs...)
}

// wrap names m's cluster in err (nil stays nil). An error that is not the
// operation's own (a refusal, a conflict, bad input ...) is checked
// against the cluster's reachability: if a short read of the cluster fails
// too, the error is marked unavailable.
func (m *member) wrap(err error) error {
	if err == nil {
		return nil
	}
	if ce, ok := errors.AsType[*ClusterError](err); ok && ce.Cluster == m.name {
		return err
	}
	return &ClusterError{Cluster: m.name, Unavailable: !ownError(err) && !m.reachable(), Err: err}
}

// ownError reports whether err is an answer of stockctl's own, from a
// cluster that was reached.
func ownError(err error) bool {
	for _, s := range []error{ErrInvalidArgument, ErrInsufficientStock, ErrUnknownSKU, ErrOrderNotFound, ErrOrderPruned,
		ErrConflict, ErrCorrupt, ErrExpired, ErrLimitExceeded, ErrLocked, ErrNotHeld, ErrModeHeld, ErrLimitMismatch,
		ErrFleetMismatch, context.Canceled} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// probeTimeout bounds a reachability probe; probeFresh is how long its
// answer is reused.
const (
	probeTimeout = time.Second
	probeFresh   = time.Second
)

// reachable reports whether m's cluster answered a linearizable read
// within probeTimeout, within the last probeFresh.
func (m *member) reachable() bool {
	m.probeMu.Lock()
	defer m.probeMu.Unlock()
	if time.Since(m.probeAt) < probeFresh {
		return m.probeOK
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	_, err := m.c.kv.Get(clientv3.WithRequireLeader(ctx), m.c.keys.Fleet())
	m.probeAt, m.probeOK = time.Now(), err == nil
	return m.probeOK
}

// connectWait bounds how long an operation waits for its cluster's
// connection to come up before it fails as unavailable (at most half of
// what is left of its ctx, so that the error reaches the caller in time).
const connectWait = 2 * time.Second

// connected fails at once, naming the cluster, when m's etcd connection is
// down (a cluster stopped or refusing connections) and does not come up
// within connectWait; an operation would otherwise wait for its whole
// deadline. A partition that keeps the connection up is only found by the
// operation's own deadline.
func (m *member) connected(ctx context.Context) error {
	return m.connectedWithin(ctx, connectWaitFor(ctx))
}

// connectWaitFor is connectWait, or half of what is left of ctx if less.
func connectWaitFor(ctx context.Context) time.Duration {
	wait := connectWait
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)/2)
	}
	return wait
}

// connectedWithin is connected with its wait given: a lookup runs on the
// fleet's context but answers a caller, whose deadline sets the wait.
func (m *member) connectedWithin(ctx context.Context, wait time.Duration) error {
	conn := m.c.client.ActiveConnection()
	if conn == nil {
		return nil
	}
	st := conn.GetState()
	if st == connectivity.Ready || st == connectivity.Idle {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for st != connectivity.Ready && st != connectivity.Idle {
		if st == connectivity.Shutdown || !conn.WaitForStateChange(wctx, st) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return &ClusterError{Cluster: m.name, Unavailable: true, Err: fmt.Errorf("its etcd connection stayed %s for %v", st, wait.Round(time.Millisecond))}
		}
		st = conn.GetState()
	}
	return nil
}

// onSKU runs f on the segment engine of sku's cluster: the coordinator's
// own for one cluster; for several, the cluster sku is placed in (found on
// a cache miss by reading every cluster), its errors naming the cluster.
// Every stock operation of a SKU goes through it.
func onSKU[T any](ctx context.Context, c *Coordinator, sku string, f func(*segments.Engine) (T, error)) (T, error) {
	if c.fleet == nil {
		return f(c.stock)
	}
	return routeSKU(ctx, c.fleet, sku, f)
}

func routeSKU[T any](ctx context.Context, fl *fleet, sku string, f func(*segments.Engine) (T, error)) (T, error) {
	if segments.ValidateSKU(sku) != nil {
		return f(fl.members[0].c.stock) // its own validation error, as for one cluster
	}
	var zero T
	m, cached, err := fl.route(ctx, sku)
	if err != nil {
		return zero, err
	}
	if err := m.connected(ctx); err != nil {
		return zero, err
	}
	v, err := f(m.c.stock)
	if cached && errors.Is(err, ErrUnknownSKU) {
		// Deleted here, maybe created again elsewhere: look again.
		fl.forget(sku, m)
		m2, _, lerr := fl.route(ctx, sku)
		if lerr != nil || m2 == m {
			return v, m.wrap(err)
		}
		m = m2
		v, err = f(m.c.stock)
	}
	return v, m.wrap(err)
}
