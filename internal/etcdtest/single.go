package etcdtest

import (
	"slices"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/embedetcd"
)

// Single is one embedded etcd member owned by a test.
type Single struct {
	mu        sync.Mutex
	cfg       embedetcd.Config // ports pinned after the first start
	srv       *embedetcd.Server
	endpoints []string
}

// NewSingle starts one embedded etcd member for t, in t.TempDir(), on free
// loopback ports. The member is stopped at cleanup.
func NewSingle(t testing.TB, opts ...Option) *Single {
	t.Helper()
	o := buildOptions(opts)
	// TempDir comes first: cleanups run last-in first-out, so the member is
	// stopped before the testing package removes its data dir.
	dir := t.TempDir()
	s := &Single{}
	t.Cleanup(s.Stop)

	s.cfg = embedetcd.Config{Dir: dir, UnsafeNoFsync: o.noFsync, GRPCServerOptions: o.grpcOptions, QuotaBackendBytes: o.quota, MaxTxnOps: o.maxTxnOps}
	srv, err := startMember(t, s.cfg)
	if err != nil {
		t.Fatalf("etcdtest: start single member: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srv = srv
	s.endpoints = srv.Endpoints()
	// Pin the ports picked for ":0" so that Restart comes back where clients
	// expect it.
	s.cfg.ClientAddr = hostOf(t, s.endpoints[0])
	s.cfg.PeerAddr = srv.Etcd().Config().AdvertisePeerUrls[0].Host
	return s
}

// Endpoints returns the member's client URLs; they stay the same across
// Stop and Restart.
func (s *Single) Endpoints() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.endpoints)
}

// Client returns a new client for the member, closed at t's cleanup.
func (s *Single) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	return newClient(t, s.Endpoints())
}

// Server returns the running member, or nil while it is stopped.
func (s *Single) Server() *embedetcd.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}

// Stop stops the member and keeps its data. Stopping a stopped member is a
// no-op.
func (s *Single) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		s.srv.Close()
		s.srv = nil
	}
}

// Restart stops the member if it runs and starts it again on the same data
// dir and the same ports, waiting until it serves.
func (s *Single) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	srv, err := startMember(t, s.cfg)
	if err != nil {
		t.Fatalf("etcdtest: restart single member in %s: %v", s.cfg.Dir, err)
	}
	s.srv = srv
	if got := srv.Endpoints(); !slices.Equal(got, s.endpoints) {
		// Cannot happen with pinned ports; if it does, old clients would
		// silently talk to nothing.
		t.Fatalf("etcdtest: restarted member serves %v, want %v", got, s.endpoints)
	}
}
