package etcdtest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/embedetcd"
)

// Cluster is an n-member embedded etcd cluster owned by a test. Members are
// indexed 0..n-1 and named m0, m1, ...
type Cluster struct {
	mu        sync.Mutex
	cfgs      []embedetcd.Config
	members   []*embedetcd.Server // nil while stopped
	endpoints []string
}

// NewCluster starts an n-member cluster on loopback ports chosen up front,
// each member in its own t.TempDir(), and waits until it has a leader that
// all members agree on. All members are stopped at cleanup.
func NewCluster(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("etcdtest: NewCluster(%d): need at least one member", n)
	}
	o := buildOptions(opts)
	// TempDirs first: cleanups run last-in first-out, so the members are
	// stopped before the testing package removes their data dirs.
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = t.TempDir()
	}
	c := &Cluster{
		cfgs:      make([]embedetcd.Config, n),
		members:   make([]*embedetcd.Server, n),
		endpoints: make([]string, n),
	}
	t.Cleanup(c.stopAll)

	// Every member must know every peer URL before any of them starts, so
	// all ports are chosen here, in one call so that they are distinct.
	ports := FreePorts(t, 2*n)
	peers := make([]string, n)
	for i := range n {
		peers[i] = fmt.Sprintf("m%d=http://127.0.0.1:%d", i, ports[n+i])
	}
	initial := strings.Join(peers, ",")
	for i := range n {
		c.cfgs[i] = embedetcd.Config{
			Dir:               dirs[i],
			Name:              fmt.Sprintf("m%d", i),
			ClientAddr:        fmt.Sprintf("127.0.0.1:%d", ports[i]),
			PeerAddr:          fmt.Sprintf("127.0.0.1:%d", ports[n+i]),
			InitialCluster:    initial,
			UnsafeNoFsync:     o.noFsync,
			GRPCServerOptions: o.grpcOptions,
		}
		c.endpoints[i] = fmt.Sprintf("http://127.0.0.1:%d", ports[i])
	}

	// Concurrently, because a member only becomes ready once a quorum of the
	// cluster is up: starting them one by one would deadlock.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			srv, err := startMember(t, c.cfgs[i])
			if err != nil {
				errs[i] = fmt.Errorf("member m%d: %w", i, err)
				return
			}
			c.mu.Lock()
			c.members[i] = srv
			c.mu.Unlock()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("etcdtest: start %d-member cluster: %v", n, err)
	}
	c.WaitHealthy(t)
	return c
}

// Endpoints returns all members' client URLs, running or not.
func (c *Cluster) Endpoints() []string {
	return slices.Clone(c.endpoints)
}

// Client returns a new client over all members' endpoints, closed at t's
// cleanup.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	return newClient(t, c.Endpoints())
}

// Member returns member i, or nil while it is stopped.
func (c *Cluster) Member(i int) *embedetcd.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i]
}

// Stop stops member i and keeps its data. If it was the leader, etcd hands
// leadership to another member as part of stopping. Stopping a stopped
// member is a no-op.
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	m := c.members[i]
	c.members[i] = nil
	c.mu.Unlock()
	if m != nil {
		m.Close()
	}
}

// Restart stops member i if it runs, starts it again with the same data dir
// and ports, and waits until it serves (which needs a quorum of the cluster).
func (c *Cluster) Restart(t testing.TB, i int) {
	t.Helper()
	c.Stop(i)
	srv, err := startMember(t, c.cfgs[i])
	if err != nil {
		t.Fatalf("etcdtest: restart member m%d: %v", i, err)
	}
	c.mu.Lock()
	c.members[i] = srv
	c.mu.Unlock()
}

// Leader returns the index of the current raft leader, waiting up to 10s
// for one. The leader must be running, consider itself leader, and be
// recognised by a quorum of the cluster, so a just-deposed leader that has
// not noticed yet is not returned.
func (c *Cluster) Leader(t testing.TB) int {
	t.Helper()
	deadline := time.Now().Add(leaderWait)
	for {
		if i := c.leaderIndex(); i >= 0 {
			return i
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcdtest: no leader after %v: %s", leaderWait, c.describe())
		}
		time.Sleep(pollInterval)
	}
}

// WaitHealthy waits until every running member reports the same leader and
// that leader is itself running; it fails t after 20s.
func (c *Cluster) WaitHealthy(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(healthyWait)
	for !c.healthy() {
		if time.Now().After(deadline) {
			t.Fatalf("etcdtest: cluster not healthy after %v: %s", healthyWait, c.describe())
		}
		time.Sleep(pollInterval)
	}
}

// view is a snapshot of who is running and whom each thinks is leader.
type view struct {
	ids, leads []types.ID // zero for stopped members
}

func (c *Cluster) view() view {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := view{ids: make([]types.ID, len(c.members)), leads: make([]types.ID, len(c.members))}
	for i, m := range c.members {
		if m == nil {
			continue
		}
		srv := m.Etcd().Server
		v.ids[i] = srv.MemberID()
		v.leads[i] = srv.Leader()
	}
	return v
}

func (c *Cluster) leaderIndex() int {
	v := c.view()
	quorum := len(v.ids)/2 + 1
	for i, id := range v.ids {
		if id == 0 || v.leads[i] != id {
			continue
		}
		if votes := countEq(v.leads, id); votes >= quorum {
			return i
		}
	}
	return -1
}

func (c *Cluster) healthy() bool {
	v := c.view()
	var lead types.ID
	for i, id := range v.ids {
		if id == 0 {
			continue
		}
		if v.leads[i] == 0 || (lead != 0 && v.leads[i] != lead) {
			return false
		}
		lead = v.leads[i]
	}
	return lead != 0 && slices.Contains(v.ids, lead)
}

func countEq(ids []types.ID, id types.ID) int {
	n := 0
	for _, x := range ids {
		if x == id {
			n++
		}
	}
	return n
}

// describe says, for a failure message, what each member is and thinks.
func (c *Cluster) describe() string {
	v := c.view()
	parts := make([]string, len(v.ids))
	for i, id := range v.ids {
		if id == 0 {
			parts[i] = fmt.Sprintf("m%d stopped", i)
			continue
		}
		parts[i] = fmt.Sprintf("m%d id=%s leader=%s", i, id, v.leads[i])
	}
	return strings.Join(parts, "; ")
}

// stopAll stops the followers concurrently and the leader last. A leader
// hands leadership to a live follower when it stops and waits up to etcd's
// request timeout (7s) for that to finish; with the followers gone first it
// has nobody to hand over to and stops at once, while stopping everything
// at the same time would let it wait the full 7s for a follower that is
// itself shutting down.
func (c *Cluster) stopAll() {
	v := c.view()
	lead := -1
	var wg sync.WaitGroup
	for i, id := range v.ids {
		if id != 0 && v.leads[i] == id {
			lead = i
			continue
		}
		wg.Go(func() { c.Stop(i) })
	}
	wg.Wait()
	if lead >= 0 {
		c.Stop(lead)
	}
}
