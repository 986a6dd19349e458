package etcdtest

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/pkg/v3/proxy"
	"go.uber.org/zap"
)

// proxyCloseWait bounds Proxy.Close. The etcd proxy's Close waits for every
// proxied connection to end, which only happens once the client or the
// target closes it; a test that forgot to close a client must not hang.
const proxyCloseWait = 10 * time.Second

// Proxy is a TCP proxy (go.etcd.io/etcd/pkg/v3/proxy) between clients and
// one etcd endpoint, for injecting network faults.
type Proxy struct {
	t         testing.TB
	srv       proxy.Server
	endpoint  string
	closeOnce sync.Once
}

// NewProxy starts a proxy to target, a URL like http://127.0.0.1:2379, on a
// free local port. It is closed at t's cleanup.
//
// The etcd proxy binds ":port" (all interfaces) whenever it is given a port;
// Endpoint always names 127.0.0.1, and only loopback traffic goes through it.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	to, err := url.Parse(target)
	if err != nil || to.Host == "" || (to.Scheme != "http" && to.Scheme != "tcp") {
		t.Fatalf("etcdtest: proxy target %q: want http://host:port (%v)", target, err)
	}
	p := &Proxy{t: t}
	t.Cleanup(p.Close)

	// The port is probed first because the proxy cannot report the port of a
	// ":0" listener; losing it to someone else in between is retried.
	var lastErr error
	for attempt := 1; attempt <= 5; attempt++ {
		port := FreePorts(t, 1)[0]
		srv, err := startProxy(fmt.Sprintf("127.0.0.1:%d", port), to.Host)
		if err == nil {
			p.srv = srv
			p.endpoint = fmt.Sprintf("http://127.0.0.1:%d", port)
			return p
		}
		lastErr = err
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	t.Fatalf("etcdtest: start proxy to %s: %v", target, lastErr)
	return nil
}

func startProxy(from, to string) (proxy.Server, error) {
	srv := proxy.NewServer(proxy.ServerConfig{
		Logger: zap.NewNop(), // the proxy logs every fault toggled at info
		From:   url.URL{Scheme: "tcp", Host: from},
		To:     url.URL{Scheme: "tcp", Host: to},
	})
	select {
	case <-srv.Ready():
	case <-srv.Done():
		// NewServer closes itself after a failed listen and leaves the error
		// in Error().
		select {
		case err := <-srv.Error():
			return nil, fmt.Errorf("listen on %s: %w", from, err)
		default:
			return nil, fmt.Errorf("listen on %s: proxy closed", from)
		}
	case <-time.After(5 * time.Second):
		srv.Close()
		return nil, fmt.Errorf("listen on %s: not ready after 5s", from)
	}
	// The proxy reports every failed dial or read on a channel of 16 and
	// stops accepting once nobody reads it, so keep draining it. Those
	// errors are the faults we inject or targets we stopped on purpose.
	go func() {
		for {
			select {
			case <-srv.Error():
			case <-srv.Done():
				return
			}
		}
	}()
	return srv, nil
}

// Endpoint returns the URL clients should dial to go through the proxy.
func (p *Proxy) Endpoint() string { return p.endpoint }

// Blackhole cuts clients off from etcd as a network partition or a frozen
// process does: nothing gets through in either direction and connections
// stay open, so requests hang until their deadline. What is sent meanwhile
// is held, not dropped, and delivered in order by Unblackhole, as TCP
// delivers it once a partition shorter than its retransmission timeout
// heals (requests sent during the cut may so be applied late).
//
// Bytes are never dropped out of a live connection: no real network does
// that to a TCP stream, and it leaves the two ends' HTTP/2 header
// compression out of step, after which the server refuses every request
// on the connection that names a header it never saw (RST_STREAM
// PROTOCOL_ERROR) until the connection is closed.
func (p *Proxy) Blackhole() {
	p.srv.PauseTx()
	p.srv.PauseRx()
}

// Unblackhole lets traffic through again, delivering what was held.
func (p *Proxy) Unblackhole() {
	p.srv.UnpauseTx()
	p.srv.UnpauseRx()
}

// BlackholeReplies drops the traffic from etcd to clients only: requests
// still reach etcd and are applied, but their replies never arrive, so the
// clients' calls hang until their deadline. It is how a test loses the reply
// of a request that succeeded. Heal undoes it.
func (p *Proxy) BlackholeReplies() {
	p.srv.BlackholeRx()
}

// CutReplies loses the reply of the next request: from the first frame
// etcd sends in answer to a request sent after the call, it corrupts every
// byte etcd sends to clients, so that the client's connection fails (gRPC
// reports a protocol error and drops it) instead of delivering the answer.
// The request was applied; its caller sees a dropped connection. Frames
// etcd sends before that answer (an earlier reply's tail, flow control,
// keepalive answers on older streams) pass unharmed: breaking the
// connection on one of them would stop the request from reaching etcd.
// New connections fail the same way until Heal. It needs plaintext HTTP/2
// (the proxy reads the frame headers) and one client connection.
func (p *Proxy) CutReplies() {
	r := newReplyCutter()
	p.srv.ModifyTx(r.sent)
	p.srv.ModifyRx(r.received)
}

// Heal undoes every fault: Blackhole, BlackholeReplies and CutReplies.
func (p *Proxy) Heal() {
	p.srv.UnmodifyTx()
	p.srv.UnmodifyRx()
	p.Unblackhole()
}

// Close stops accepting connections and waits, at most 10s, for the proxied
// ones to end (they end when their client or the target closes them). It is
// idempotent.
func (p *Proxy) Close() {
	p.closeOnce.Do(func() {
		if p.srv == nil {
			return
		}
		done := make(chan error, 1)
		go func() { done <- p.srv.Close() }()
		select {
		case err := <-done:
			if err != nil && !strings.Contains(err.Error(), "use of closed network connection") {
				p.t.Logf("etcdtest: close proxy %s: %v", p.endpoint, err)
			}
		case <-time.After(proxyCloseWait):
			p.t.Logf("etcdtest: proxy %s still has open connections after %v; leaving them to their clients", p.endpoint, proxyCloseWait)
		}
	})
}
