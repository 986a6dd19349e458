package service_test

import (
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdtest"
)

const (
	kindShared    = stockctlv1.LockKind_LOCK_KIND_SHARED
	kindSemaphore = stockctlv1.LockKind_LOCK_KIND_SEMAPHORE
)

// openKindHold opens a Hold stream of a kind (and limit) and sends its
// acquire.
func openKindHold(t *testing.T, c stockctlv1connect.LockServiceClient, name string, kind stockctlv1.LockKind, limit int32, wait *durationpb.Duration) holdStream {
	t.Helper()
	s := c.Hold(ctx(t))
	if err := s.Send(&stockctlv1.HoldRequest{Action: &stockctlv1.HoldRequest_Acquire{Acquire: &stockctlv1.HoldAcquire{
		Name: name, Kind: kind, Limit: limit, Wait: wait}}}); err != nil {
		t.Fatalf("send acquire: %v", err)
	}
	t.Cleanup(func() { _ = s.CloseRequest(); _ = s.CloseResponse() })
	return s
}

// acquiredEvent waits for the stream's acquired event.
func acquiredEvent(t *testing.T, s holdStream) *stockctlv1.HoldAcquired {
	t.Helper()
	res, err := s.Receive()
	if err != nil {
		t.Fatalf("waiting for acquired: %v", err)
	}
	a := res.GetAcquired()
	if a == nil || a.Token == 0 || a.Revision == 0 || a.Token>>16 != a.Revision {
		t.Fatalf("first event %v, want acquired with a token over its revision", res)
	}
	return a
}

// Shared holds over both shapes: a stream's and a unary caller's hold one
// name together, each with its own token; an exclusive request is busy
// meanwhile, and once they are gone gets a larger token than both.
func TestSharedHoldsOverBothShapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	stream := openKindHold(t, e.grpcLocks(t), "report", kindShared, 0, nil)
	a := acquiredEvent(t, stream)
	if a.Kind != kindShared {
		t.Fatalf("acquired kind %v", a.Kind)
	}
	c := e.locks(t, connectJSON)
	b := acquireLease(t, c, &stockctlv1.AcquireRequest{Name: "report", Kind: kindShared, Wait: durationpb.New(0)})
	if b.Kind != kindShared || b.Token == a.Token {
		t.Fatalf("unary shared hold %v beside the stream's token %d", b, a.Token)
	}
	_, err := c.Acquire(ctx(t), connect.NewRequest(&stockctlv1.AcquireRequest{Name: "report", Wait: durationpb.New(0)}))
	wantError(t, "exclusive while shared holders hold", err, connect.CodeAborted, stockctlv1.ErrorReason_ERROR_REASON_LOCK_BUSY)

	release(t, stream)
	if _, err := c.Release(ctx(t), connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{HoldId: b.HoldId})); err != nil {
		t.Fatal(err)
	}
	w := acquireLease(t, c, &stockctlv1.AcquireRequest{Name: "report", Kind: stockctlv1.LockKind_LOCK_KIND_EXCLUSIVE, Wait: durationpb.New(0)})
	if w.Token <= max(a.Token, b.Token) {
		t.Fatalf("exclusive token %d, want more than the readers' %d and %d", w.Token, a.Token, b.Token)
	}
	_, err = c.Acquire(ctx(t), connect.NewRequest(&stockctlv1.AcquireRequest{Name: "report", Kind: kindShared, Wait: durationpb.New(0)}))
	wantError(t, "shared while a writer holds", err, connect.CodeAborted, stockctlv1.ErrorReason_ERROR_REASON_LOCK_BUSY)
}

// Semaphore permits over both shapes: at most limit holders; a limit
// mismatch and bad limits are refused with their reasons and details; a
// waiter gets the permit a holder releases, with a larger token.
func TestSemaphoreOverBothShapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	stream := openKindHold(t, e.grpcLocks(t), "db", kindSemaphore, 2, nil)
	a := acquiredEvent(t, stream)
	if a.Kind != kindSemaphore || a.Limit != 2 {
		t.Fatalf("acquired %v", a)
	}
	c := e.locks(t, connectJSON)
	b := acquireLease(t, c, &stockctlv1.AcquireRequest{Name: "db", Kind: kindSemaphore, Limit: 2, Wait: durationpb.New(0)})
	if b.Limit != 2 || b.Token == a.Token {
		t.Fatalf("second permit %v", b)
	}
	_, err := c.Acquire(ctx(t), connect.NewRequest(&stockctlv1.AcquireRequest{Name: "db", Kind: kindSemaphore, Limit: 2, Wait: durationpb.New(0)}))
	wantError(t, "a third permit of 2", err, connect.CodeAborted, stockctlv1.ErrorReason_ERROR_REASON_LOCK_BUSY)

	_, err = c.Acquire(ctx(t), connect.NewRequest(&stockctlv1.AcquireRequest{Name: "db", Kind: kindSemaphore, Limit: 3}))
	wantError(t, "another limit", err, connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_LIMIT_MISMATCH)
	if d := detail[*stockctlv1.LimitMismatch](t, err); d.Name != "db" || d.Limit != 3 || d.HeldLimit != 2 {
		t.Errorf("LimitMismatch = %v", d)
	}
	for _, tc := range []struct {
		name string
		req  *stockctlv1.AcquireRequest
	}{
		{"limit 0", &stockctlv1.AcquireRequest{Name: "db", Kind: kindSemaphore}},
		{"negative limit", &stockctlv1.AcquireRequest{Name: "db", Kind: kindSemaphore, Limit: -1}},
		{"limit too large", &stockctlv1.AcquireRequest{Name: "db", Kind: kindSemaphore, Limit: 1025}},
		{"limit on a lock", &stockctlv1.AcquireRequest{Name: "db", Limit: 2}},
		{"bad name", &stockctlv1.AcquireRequest{Name: "a/b", Kind: kindSemaphore, Limit: 2}},
	} {
		_, err := c.Acquire(ctx(t), connect.NewRequest(tc.req))
		wantError(t, tc.name, err, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT)
	}
	bad := openKindHold(t, e.grpcLocks(t), "db", kindSemaphore, 0, nil)
	_, err = bad.Receive()
	wantError(t, "a stream without a limit", err, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT)

	// A waiting stream gets the permit the unary holder releases.
	waiter := openKindHold(t, e.grpcLocks(t), "db", kindSemaphore, 2, nil)
	got := make(chan *stockctlv1.HoldAcquired, 1)
	go func() {
		res, err := waiter.Receive()
		if err != nil {
			got <- nil
			return
		}
		got <- res.GetAcquired()
	}()
	if _, err := c.Release(ctx(t), connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{HoldId: b.HoldId})); err != nil {
		t.Fatal(err)
	}
	select {
	case w := <-got:
		if w == nil || w.Token <= max(a.Token, b.Token) {
			t.Fatalf("the waiter's permit %v, want a token above %d and %d", w, a.Token, b.Token)
		}
	case <-time.After(hangBound):
		t.Fatal("the waiter never got the released permit")
	}
	release(t, waiter)
	release(t, stream)
}

// Callers of one server that take one lock in turn each get a larger token,
// also when the server's coordinator hands the lock from one to the next
// without going back to etcd (same key revision): no caller is kept out of
// the coordinator's local queue any more.
func TestTokensGrowAcrossCallersOfOneServer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withCoordOptions(coordinator.WithCohort(32, time.Hour)))
	c := e.grpcLocks(t)
	first := openHold(t, c, ctx(t), "seq", nil, nil)
	prev := acquiredEvent(t, first)
	streams := make([]holdStream, 4)
	for i := range streams {
		streams[i] = openHold(t, c, ctx(t), "seq", nil, nil)
		etcdtest.WaitFor(t, "the caller to queue in the server", hangBound, func() bool {
			return engines.Of(e.coord).Locks.LocalWaiters(engines.Of(e.coord).Keys.Lock("seq")) == i+1
		})
	}
	release(t, first)
	for _, s := range streams { // served in arrival order
		a := acquiredEvent(t, s)
		if a.Token <= prev.Token || a.Revision != prev.Revision {
			t.Fatalf("token %d (key revision %d) after %d (revision %d): want a larger token under the same key",
				a.Token, a.Revision, prev.Token, prev.Revision)
		}
		prev = a
		release(t, s)
	}
}
