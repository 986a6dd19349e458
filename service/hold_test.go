package service_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
)

type holdStream = *connect.BidiStreamForClient[stockctlv1.HoldRequest, stockctlv1.HoldResponse]

// openHold opens a Hold stream and sends its acquire.
func openHold(t *testing.T, c stockctlv1connect.LockServiceClient, ctx context.Context, name string, ttl, wait *durationpb.Duration) holdStream {
	t.Helper()
	s := c.Hold(ctx)
	if err := s.Send(&stockctlv1.HoldRequest{Action: &stockctlv1.HoldRequest_Acquire{Acquire: &stockctlv1.HoldAcquire{
		Name: name, Ttl: ttl, Wait: wait}}}); err != nil {
		t.Fatalf("send acquire: %v", err)
	}
	t.Cleanup(func() { _ = s.CloseRequest(); _ = s.CloseResponse() })
	return s
}

// acquired waits for the stream's acquired event and returns its token.
func acquired(t *testing.T, s holdStream) int64 {
	t.Helper()
	res, err := s.Receive()
	if err != nil {
		t.Fatalf("waiting for acquired: %v", err)
	}
	a := res.GetAcquired()
	if a == nil || a.Token == 0 {
		t.Fatalf("first event %v, want acquired with a token", res)
	}
	return a.Token
}

func release(t *testing.T, s holdStream) {
	t.Helper()
	if err := s.Send(&stockctlv1.HoldRequest{Action: &stockctlv1.HoldRequest_Release{Release: &stockctlv1.HoldRelease{}}}); err != nil {
		t.Fatal(err)
	}
	res, err := s.Receive()
	if err != nil || res.GetReleased() == nil {
		t.Fatalf("after release: %v, %v; want released", res, err)
	}
}

// expectLost waits for the stream's lost event and the LOCK_LOST end.
func expectLost(t *testing.T, s holdStream, reason stockctlv1.LostReason) {
	t.Helper()
	res, err := s.Receive()
	if err != nil {
		t.Fatalf("waiting for lost: %v", err)
	}
	if l := res.GetLost(); l == nil || l.Reason != reason {
		t.Fatalf("event %v, want lost %v", res, reason)
	}
	_, err = s.Receive()
	wantError(t, "stream end after lost", err, connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_LOCK_LOST)
}

// A holder that releases hands the lock to the next, whose token is
// larger; closing one's side of the stream releases too.
func TestHoldStreamHandsOver(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcLocks(t)
	first := openHold(t, c, ctx(t), "report", nil, nil)
	t1 := acquired(t, first)

	second := openHold(t, c, ctx(t), "report", nil, nil)
	got := make(chan int64, 1)
	go func() {
		res, err := second.Receive()
		if err != nil || res.GetAcquired() == nil {
			got <- -1
			return
		}
		got <- res.GetAcquired().Token
	}()
	// Busy meanwhile, for a third caller that does not wait.
	busy := openHold(t, c, ctx(t), "report", nil, durationpb.New(0))
	_, err := busy.Receive()
	wantError(t, "hold of a held lock with wait 0", err, connect.CodeAborted, stockctlv1.ErrorReason_ERROR_REASON_LOCK_BUSY)
	if d := detail[*stockctlv1.LockBusy](t, err); d.Name != "report" {
		t.Errorf("LockBusy = %v", d)
	}

	release(t, first)
	t2 := <-got
	if t2 <= t1 {
		t.Fatalf("second holder's token %d, want more than the first's %d", t2, t1)
	}
	if err := second.CloseRequest(); err != nil {
		t.Fatal(err)
	}
	if res, err := second.Receive(); err != nil || res.GetReleased().GetToken() != t2 {
		t.Fatalf("after closing its side: %v, %v; want released", res, err)
	}
}

// A holder whose connection drops loses the lock at once (its ttl, 5
// minutes, is far beyond the test's bound), and the next holder's token is
// larger.
func TestHoldStreamDroppedConnection(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dropper := &connDropper{}
	dc := stockctlv1connect.NewLockServiceClient(dropper.client(t), e.url, connect.WithGRPC())
	first := openHold(t, dc, ctx(t), "nightly", durationpb.New(5*time.Minute), nil)
	t1 := acquired(t, first)

	next := openHold(t, e.grpcLocks(t), ctx(t), "nightly", nil, nil)
	dropper.drop()
	if t2 := acquired(t, next); t2 <= t1 {
		t.Fatalf("next holder's token %d, want more than %d", t2, t1)
	}
}

// A holder that stays connected but silent loses the lock after its ttl,
// is told so, and the next holder's token is larger.
func TestHoldStreamKeepAliveTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcLocks(t)
	silent := openHold(t, c, ctx(t), "silent", durationpb.New(time.Second), nil)
	t1 := acquired(t, silent)
	next := openHold(t, c, ctx(t), "silent", nil, nil)
	expectLost(t, silent, stockctlv1.LostReason_LOST_REASON_KEEPALIVE_TIMEOUT)
	if t2 := acquired(t, next); t2 <= t1 {
		t.Fatalf("next token %d, want more than %d", t2, t1)
	}
}

// Keep-alives keep a hold past its ttl.
func TestHoldStreamKeepAlive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcLocks(t)
	const ttl = time.Second
	s := openHold(t, c, ctx(t), "kept", durationpb.New(ttl), nil)
	acquired(t, s)
	for deadline := time.Now().Add(2 * ttl); time.Now().Before(deadline); time.Sleep(ttl / 20) {
		if err := s.Send(&stockctlv1.HoldRequest{Action: &stockctlv1.HoldRequest_KeepAlive{KeepAlive: &stockctlv1.HoldKeepAlive{}}}); err != nil {
			t.Fatal(err)
		}
	}
	// Still held: another caller finds it busy.
	busy := openHold(t, c, ctx(t), "kept", nil, durationpb.New(0))
	_, err := busy.Receive()
	wantError(t, "held lock", err, connect.CodeAborted, stockctlv1.ErrorReason_ERROR_REASON_LOCK_BUSY)
	release(t, s)
}

// When the server's etcd session ends, its holders are told the lock was
// lost; the next holder gets a larger token.
func TestHoldStreamSessionLost(t *testing.T) {
	t.Parallel()
	// A short session TTL: the coordinator notices the revoked lease at its
	// next keepalive, a third of the TTL later.
	e := newEnv(t, withCoordOptions(coordinator.WithSessionTTL(time.Second)))
	c := e.grpcLocks(t)
	s := openHold(t, c, ctx(t), "fragile", nil, nil)
	t1 := acquired(t, s)
	sess, err := engines.Of(e.coord).Locks.Session(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.coord.Client().Revoke(ctx(t), sess.Lease()); err != nil {
		t.Fatal(err)
	}
	expectLost(t, s, stockctlv1.LostReason_LOST_REASON_SESSION_LOST)
	again := openHold(t, c, ctx(t), "fragile", nil, nil)
	if t2 := acquired(t, again); t2 <= t1 {
		t.Fatalf("token after the loss %d, want more than %d", t2, t1)
	}
}

// The caller's deadline bounds a wait for a lock, and a waiter that gave up
// leaves nothing behind.
func TestHoldDeadlineBoundsTheWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcLocks(t)
	holder := openHold(t, c, ctx(t), "slow", nil, nil)
	acquired(t, holder)

	short, cancel := context.WithTimeout(ctx(t), 300*time.Millisecond)
	defer cancel()
	_, err := c.Acquire(short, connect.NewRequest(&stockctlv1.AcquireRequest{Name: "slow"}))
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("Acquire past its deadline: %v, want deadline_exceeded", err)
	}
	release(t, holder)
	res, err := c.Acquire(ctx(t), connect.NewRequest(&stockctlv1.AcquireRequest{Name: "slow", Wait: durationpb.New(0)}))
	if err != nil {
		t.Fatalf("Acquire after the holder left (the timed-out waiter must not be queued): %v", err)
	}
	if _, err := c.Release(ctx(t), connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{HoldId: res.Msg.HoldId})); err != nil {
		t.Fatal(err)
	}
	// And no key of the server is left in etcd.
	keys, err := e.coord.Client().Get(ctx(t), e.coord.Prefix()+"locks/slow/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || keys.Count != 0 {
		t.Fatalf("lock keys left: %v, %v", keys, err)
	}
}

// Shutting the server down releases the streams' locks and says so.
func TestHoldStreamServerShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := openHold(t, e.grpcLocks(t), ctx(t), "until-shutdown", nil, nil)
	acquired(t, s)
	go func() { _ = e.srv.Close() }()
	expectLost(t, s, stockctlv1.LostReason_LOST_REASON_SERVER_SHUTDOWN)
}

// connDropper makes HTTP clients whose TCP connections the test can cut.
type connDropper struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (d *connDropper) client(t *testing.T) *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			d.mu.Lock()
			d.conns = append(d.conns, conn)
			d.mu.Unlock()
		}
		return conn, err
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func (d *connDropper) drop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		_ = c.Close()
	}
}

// A caller that sends acquire and release at once, without waiting for
// acquired, gets either acquired then released, or (withdrawn before the
// lock came) nothing; either way the stream ends OK and the lock is free.
func TestHoldStreamPipelinedRelease(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.grpcLocks(t)
	for range 5 {
		s := openHold(t, c, ctx(t), "pipelined", nil, nil)
		if err := s.Send(&stockctlv1.HoldRequest{Action: &stockctlv1.HoldRequest_Release{Release: &stockctlv1.HoldRelease{}}}); err != nil {
			t.Fatal(err)
		}
		var events []string
		for {
			res, err := s.Receive()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatalf("stream ended with %v after %v", err, events)
				}
				break
			}
			switch {
			case res.GetAcquired() != nil:
				events = append(events, "acquired")
			case res.GetReleased() != nil:
				events = append(events, "released")
			default:
				events = append(events, res.String())
			}
		}
		if got := strings.Join(events, ","); got != "" && got != "acquired,released" {
			t.Fatalf("events %q, want none or acquired,released", got)
		}
	}
	free := openHold(t, c, ctx(t), "pipelined", nil, durationpb.New(0))
	acquired(t, free)
}
