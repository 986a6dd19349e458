package lock

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/background"
	"github.com/stockctl/stockctl/internal/etcdcall"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

// lateCounter is a slog handler that counts "session renewed late" warnings.
type lateCounter struct{ n *atomic.Int64 }

func (h lateCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h lateCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "etcd session renewed late" {
		h.n.Add(1)
	}
	return nil
}
func (h lateCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h lateCounter) WithGroup(string) slog.Handler      { return h }

// engineWithTTL is newEngine with a session TTL and a counted logger.
func engineWithTTL(t *testing.T, client *clientv3.Client, ttl time.Duration) (*Engine, *atomic.Int64) {
	t.Helper()
	late := &atomic.Int64{}
	bg := background.NewGroup()
	e := New(client, etcdcall.KV(client), bg, Config{
		SessionTTL: ttl, CohortMaxHandoffs: 32, CohortMaxHold: 100 * time.Millisecond,
		ReleaseTimeout: 5 * time.Second, TenureIdle: time.Second, Logger: slog.New(lateCounter{late}),
	})
	t.Cleanup(func() {
		_, _ = e.Close()
		bg.Stop()
		bg.Wait()
	})
	return e, late
}

// Invariant (issue 19.8): on a healthy etcd, no renewal is reported late,
// whatever the TTL asked for: with 1 s (etcd grants its minimum, 2 s) and
// 2 s, over a bounded number of renewals.
func TestNoLateRenewalsOnHealthyEtcd(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	const renewals = 8
	for _, ttl := range []time.Duration{time.Second, 2 * time.Second} {
		t.Run(ttl.String(), func(t *testing.T) {
			t.Parallel()
			e, late := engineWithTTL(t, etcd.Client(t), ttl)
			if _, err := e.Session(t.Context()); err != nil {
				t.Fatal(err)
			}
			etcdtest.WaitFor(t, fmt.Sprintf("%d renewals", renewals), 60*time.Second, func() bool { return e.renewals.Load() >= renewals })
			if n := late.Load(); n != 0 {
				t.Fatalf("%d of %d renewals reported late with a %v TTL on a healthy etcd", n, e.renewals.Load(), ttl)
			}
		})
	}
}

// Control: a renewal held up (the client's traffic blackholed just after a
// renewal, for longer than lateAfter but less than the TTL) is reported.
func TestLateRenewalReported(t *testing.T) {
	etcd := etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	proxy := etcdtest.NewProxy(t, etcd.Endpoints()[0])
	const ttl = 10 * time.Second
	e, late := engineWithTTL(t, etcdtest.NewClient(t, proxy.Endpoint()), ttl)
	if _, err := e.Session(t.Context()); err != nil {
		t.Fatal(err)
	}
	etcdtest.WaitFor(t, "a first renewal", 60*time.Second, func() bool { return e.renewals.Load() >= 1 })
	n := e.renewals.Load()
	etcdtest.WaitFor(t, "the next renewal", 60*time.Second, func() bool { return e.renewals.Load() > n })
	proxy.Blackhole()
	// The fault's length: lateAfter (6.9 s) plus a margin, well within the
	// 10 s TTL counted from the renewal just seen.
	time.Sleep(lateAfter(ttl) + 500*time.Millisecond)
	proxy.Unblackhole()
	etcdtest.WaitFor(t, "the late renewal to be reported", 60*time.Second, func() bool { return late.Load() >= 1 })
}

func TestLateAfter(t *testing.T) {
	for _, tc := range []struct{ ttl, want time.Duration }{
		{2 * time.Second, 1583333333},
		{10 * time.Second, 6916666666},
	} {
		if got := lateAfter(tc.ttl); got != tc.want {
			t.Errorf("lateAfter(%v) = %v, want %v", tc.ttl, got, tc.want)
		}
		// Above the longest healthy gap, below the TTL.
		if got := lateAfter(tc.ttl); got <= tc.ttl/3+clientKeepAliveTick || got >= tc.ttl {
			t.Errorf("lateAfter(%v) = %v is not between the healthy gap and the TTL", tc.ttl, got)
		}
	}
}
