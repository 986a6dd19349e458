package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// eventually retries op with a fresh per-attempt timeout until it succeeds,
// bounded in attempts and total time, and returns the last error.
func eventually(t *testing.T, what string, op func(ctx context.Context) error) {
	t.Helper()
	const attempts, total, perAttempt = 40, 20 * time.Second, time.Second
	start := time.Now()
	var err error
	for i := 1; i <= attempts && time.Since(start) < total; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), perAttempt)
		err = op(ctx)
		cancel()
		if err == nil {
			t.Logf("%s: ok after %d attempt(s), %v", what, i, time.Since(start).Round(time.Millisecond))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: still failing after %v: %v", what, time.Since(start).Round(time.Millisecond), err)
}

func putOp(c *clientv3.Client, k, v string) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := c.Put(ctx, k, v)
		return err
	}
}

func mustGet(t *testing.T, c *clientv3.Client, k string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, k)
	if err != nil {
		t.Fatalf("Get(%q): %v", k, err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("Get(%q): %d kvs, want 1", k, len(resp.Kvs))
	}
	return string(resp.Kvs[0].Value)
}

func TestSingleStopRestartKeepsDataAndClients(t *testing.T) {
	s := NewSingle(t, WithNoFsync())
	c := s.Client(t)
	eventually(t, "first put", putOp(c, "k", "v1"))
	if got := mustGet(t, c, "k"); got != "v1" {
		t.Fatalf("Get = %q, want v1", got)
	}

	// A watch opened before the stop must resume after the restart.
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	wch := c.Watch(wctx, "w")
	eventually(t, "put w1", putOp(c, "w", "w1"))
	waitEvent(t, wch, "w1")

	eps := s.Endpoints()
	start := time.Now()
	s.Stop()
	if s.Server() != nil {
		t.Fatal("Server() not nil after Stop")
	}
	s.Stop() // no-op
	t.Logf("stop took %v", time.Since(start).Round(time.Millisecond))

	start = time.Now()
	s.Restart(t)
	t.Logf("restart took %v", time.Since(start).Round(time.Millisecond))
	if got := s.Endpoints(); fmt.Sprint(got) != fmt.Sprint(eps) {
		t.Fatalf("endpoints changed across restart: %v -> %v", eps, got)
	}

	// The client from before the stop must find the member again by itself.
	eventually(t, "get through pre-restart client", func(ctx context.Context) error {
		resp, err := c.Get(ctx, "k")
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v1" {
			return fmt.Errorf("got %v, want k=v1", resp.Kvs)
		}
		return nil
	})
	eventually(t, "put after restart", putOp(c, "k", "v2"))
	eventually(t, "put w2", putOp(c, "w", "w2"))
	waitEvent(t, wch, "w2")
}

// waitEvent waits up to 15s for a put of value on wch, skipping other
// responses (such as progress notifications after a reconnect).
func waitEvent(t *testing.T, wch clientv3.WatchChan, value string) {
	t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case resp, ok := <-wch:
			if !ok {
				t.Fatalf("watch closed while waiting for %q", value)
			}
			if err := resp.Err(); err != nil {
				t.Fatalf("watch error while waiting for %q: %v", value, err)
			}
			for _, ev := range resp.Events {
				if string(ev.Kv.Value) == value {
					return
				}
			}
		case <-timeout:
			t.Fatalf("no watch event with value %q within 15s", value)
		}
	}
}

func TestClusterLeaderFailover(t *testing.T) {
	cl := NewCluster(t, 3, WithNoFsync())
	c := cl.Client(t)
	eventually(t, "initial put", putOp(c, "k", "v0"))

	old := cl.Leader(t)
	oldID := cl.Member(old).Etcd().Server.MemberID()
	t.Logf("leader is m%d", old)

	start := time.Now()
	cl.Stop(old)
	t.Logf("stopping leader took %v", time.Since(start).Round(time.Millisecond))
	if cl.Member(old) != nil {
		t.Fatalf("Member(%d) not nil after Stop", old)
	}

	start = time.Now()
	nl := cl.Leader(t)
	t.Logf("new leader m%d after %v", nl, time.Since(start).Round(time.Millisecond))
	if nl == old || cl.Member(nl).Etcd().Server.MemberID() == oldID {
		t.Fatalf("new leader m%d is the stopped one", nl)
	}
	eventually(t, "put with leader down", putOp(c, "k", "v1"))

	start = time.Now()
	cl.Restart(t, old)
	cl.WaitHealthy(t)
	t.Logf("restart + healthy took %v", time.Since(start).Round(time.Millisecond))
	if cl.Member(old) == nil {
		t.Fatalf("Member(%d) nil after Restart", old)
	}

	// The restarted member must have caught up: read from it alone.
	solo := newClient(t, cl.Member(old).Endpoints())
	eventually(t, "read from restarted member", func(ctx context.Context) error {
		resp, err := solo.Get(ctx, "k") // linearizable: goes through raft
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v1" {
			return fmt.Errorf("got %v, want k=v1", resp.Kvs)
		}
		return nil
	})
	eventually(t, "put after restart", putOp(c, "k", "v2"))
}

func TestProxyBlackhole(t *testing.T) {
	s := NewSingle(t, WithNoFsync())
	p := NewProxy(t, s.Endpoints()[0])
	c := newClient(t, []string{p.Endpoint()})

	eventually(t, "put through proxy", putOp(c, "k", "v1"))

	p.Blackhole()
	// A put during the cut hangs until its deadline. Its bytes are held,
	// not dropped, and may still be applied after the cut heals (as after a
	// real partition), so it writes a key of its own.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, err := c.Put(ctx, "held", "late")
	cancel()
	if err == nil {
		t.Fatal("put through blackholed proxy succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) && status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("put through blackholed proxy: %v, want DeadlineExceeded", err)
	}

	p.Unblackhole()
	// The same client's connection works again: bytes dropped out of it
	// would have left the two ends' header compression out of step.
	eventually(t, "put after unblackhole", putOp(c, "k", "v2"))
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := putOp(c, "k", fmt.Sprintf("v%d", 3+i))(ctx)
		cancel()
		if err != nil {
			t.Fatalf("put %d on the healed connection: %v", i, err)
		}
	}
	if got := mustGet(t, s.Client(t), "k"); got != "v22" {
		t.Fatalf("Get = %q, want v22", got)
	}
}

func TestFreePortsDistinct(t *testing.T) {
	ports := FreePorts(t, 10)
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("FreePorts = %v: bad or repeated port %d", ports, p)
		}
		seen[p] = true
	}
}

// Invariant: with the replies blackholed or cut, a put still reaches etcd
// and is applied, while its caller gets no answer (a deadline) or a dropped
// connection; after Heal the client works again.
func TestProxyLosesRepliesOnly(t *testing.T) {
	s := NewSingle(t, WithNoFsync())
	direct := s.Client(t)
	for _, tc := range []struct {
		name  string
		fault func(*Proxy)
	}{
		{"blackhole replies", (*Proxy).BlackholeReplies},
		{"cut replies", (*Proxy).CutReplies},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewProxy(t, s.Endpoints()[0])
			c := NewClient(t, p.Endpoint())
			key := "lost-reply/" + tc.name
			eventually(t, "put through proxy", putOp(c, key, "v0"))

			tc.fault(p)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := c.Put(ctx, key, "v1")
			cancel()
			if err == nil {
				t.Fatal("put answered although its reply was lost")
			}
			t.Logf("caller saw: %v", err)
			if got := mustGet(t, direct, key); got != "v1" {
				t.Fatalf("etcd holds %q, want v1: the request did not reach etcd", got)
			}
			p.Heal()
			eventually(t, "put after heal", putOp(c, key, "v2"))
		})
	}
}
