package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/stockctl/stockctl/internal/embedetcd"
)

const (
	// readyTimeout is generous because the machines running these tests are
	// small and shared; a healthy member is normally ready in about a second.
	readyTimeout = 30 * time.Second

	// A member restarted on the ports it just released can find one still
	// taken for a moment (or taken by someone else's probe), so binding is
	// retried, bounded both in attempts and in time.
	bindRetries = 20
	bindWindow  = 10 * time.Second
	bindBackoff = 250 * time.Millisecond

	dialTimeout  = 5 * time.Second
	leaderWait   = 10 * time.Second
	healthyWait  = 20 * time.Second
	pollInterval = 50 * time.Millisecond
)

// startMember starts a member, retrying while one of its ports is in use.
// It does not call t.Fatal, so it is safe from any goroutine.
func startMember(t testing.TB, cfg embedetcd.Config) (*embedetcd.Server, error) {
	cfg.ReadyTimeout = readyTimeout
	deadline := time.Now().Add(bindWindow)
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*readyTimeout)
		srv, err := embedetcd.Start(ctx, cfg)
		cancel()
		if err == nil {
			return srv, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, err
		}
		if attempt >= bindRetries || time.Now().After(deadline) {
			return nil, fmt.Errorf("etcdtest: port still in use after %d attempts: %w", attempt, err)
		}
		t.Logf("etcdtest: member %s: port in use, retrying (attempt %d): %v", cfg.Name, attempt, err)
		time.Sleep(bindBackoff)
	}
}

// NewClient returns a client for endpoints (a member's, a cluster's or a
// proxy's), with quiet logs and the package's dial timeout, closed at t's
// cleanup.
func NewClient(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	return newClient(t, endpoints)
}

// newClient returns a client for eps that is closed at cleanup.
func newClient(t testing.TB, eps []string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: dialTimeout,
		// Restarts and blackholes make the client warn about every retry;
		// only errors are worth a test's output.
		Logger: quietLogger(t),
	})
	if err != nil {
		t.Fatalf("etcdtest: client for %v: %v", eps, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func quietLogger(t testing.TB) *zap.Logger {
	lcfg := logutil.DefaultZapLoggerConfig
	lcfg.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
	lg, err := lcfg.Build()
	if err != nil {
		t.Logf("etcdtest: build client logger, logging nothing: %v", err)
		return zap.NewNop()
	}
	return lg
}

// hostOf returns the host:port of an endpoint URL such as
// "http://127.0.0.1:2379".
func hostOf(t testing.TB, endpoint string) string {
	t.Helper()
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		t.Fatalf("etcdtest: endpoint %q is not a URL with a host: %v", endpoint, err)
	}
	return u.Host
}
