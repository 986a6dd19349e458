package service_test

import (
	"context"
	"crypto/rand"
	mrand "math/rand/v2"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/service"
)

func requestID() string { return "rq-" + rand.Text() }

// lockFree fails t unless a caller of its own can take name within 30 s,
// far less than the ttl of the holds in these tests (and gives it back):
// no hold is left that nobody knows of.
func lockFree(t *testing.T, c stockctlv1connect.LockServiceClient, name string) {
	t.Helper()
	a, err := c.Acquire(ctx(t), connect.NewRequest(&stockctlv1.AcquireRequest{Name: name, Wait: durationpb.New(30 * time.Second)}))
	if err != nil {
		t.Fatalf("lock %s is not free: %v", name, err)
	}
	if _, err := c.Release(ctx(t), connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{HoldId: a.Msg.HoldId})); err != nil {
		t.Fatal(err)
	}
}

// holdGone reports whether the hold holdID was released.
func holdGone(t *testing.T, c stockctlv1connect.LockServiceClient, holdID string) bool {
	t.Helper()
	_, err := c.KeepAlive(ctx(t), connect.NewRequest(&stockctlv1.KeepAliveRequest{HoldId: holdID}))
	return connect.CodeOf(err) == connect.CodeNotFound
}

// Issue 28, 4: Acquire calls with deadlines of 1 to 50 ms, each with a
// request_id; a call that fails is released by its request_id (what a
// caller that lost its answer does). No hold is left that nobody knows
// of: the lock is free after, and the server keeps no live hold.
func TestAcquireTinyDeadlinesLeaveNoUnknownHold(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, p := range []protocol{protocols[0], connectJSON} {
		t.Run(p.name, func(t *testing.T) {
			c := e.locks(t, p)
			name := "tiny-" + p.name
			var granted, failed, released, withdrawn int
			for i := range 60 {
				id := requestID()
				d := time.Duration(1+i%50) * time.Millisecond
				// Another caller holds the lock and lets it go about when
				// the deadline comes, so that grants land on both sides
				// of it.
				// (A hold abandoned by the last call may still be on its way
				// out: hence a wait, far shorter than the ttl.)
				h := acquireLease(t, c, &stockctlv1.AcquireRequest{Name: name, Wait: durationpb.New(30 * time.Second)})
				let := time.AfterFunc(time.Duration(mrand.Int64N(int64(2*d))), func() {
					_, _ = c.Release(context.Background(), connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{HoldId: h.HoldId}))
				})
				cctx, cancel := context.WithTimeout(ctx(t), d)
				a, err := c.Acquire(cctx, connect.NewRequest(&stockctlv1.AcquireRequest{Name: name, RequestId: id, Ttl: durationpb.New(5 * time.Minute)}))
				cancel()
				if !let.Stop() {
					waitFor(t, "the holder's release", func() bool { return holdGone(t, c, h.HoldId) })
				} else if _, err := c.Release(ctx(t), connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{HoldId: h.HoldId})); err != nil {
					t.Fatal(err)
				}
				if err == nil {
					granted++
					if _, err := c.Release(ctx(t), connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{HoldId: a.Msg.HoldId})); err != nil {
						t.Fatalf("Release(%s): %v", a.Msg.HoldId, err)
					}
					continue
				}
				failed++
				r, err := c.Release(ctx(t), connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{RequestId: id}))
				if err != nil {
					t.Fatalf("call %d (deadline %v): Release by request_id: %v", i, d, err)
				}
				if r.Msg.Withdrawn {
					withdrawn++
				} else {
					released++
				}
			}
			t.Logf("%s: %d granted, %d failed (%d then released by request_id, %d withdrawn)", p.name, granted, failed, released, withdrawn)
			waitFor(t, "no live hold", func() bool { live, _ := service.Holds(e.srv); return live == 0 })
			lockFree(t, c, name)
		})
	}
}

// A lock granted to a caller that is gone by the time its answer would be
// sent is released by the server (CALLER_GONE), with or without a
// request_id: the hooks hold the grant back until the caller has given
// up (it cancels its call), at the two places it can happen (the lock comes at the deadline;
// the hold is registered and its answer not yet sent).
func TestAcquireGrantedToAGoneCaller(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		late      string // "grant" or "answer"
		requestID bool
	}{
		{"lock at the deadline", "grant", false},
		{"lock at the deadline, request_id", "grant", true},
		{"answer after the deadline", "answer", false},
		{"answer after the deadline, request_id", "answer", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			c := e.grpcLocks(t)
			entered := make(chan struct{})
			hook := func(ctx context.Context) {
				close(entered)
				<-ctx.Done() // the server has seen the caller go
			}
			if tc.late == "grant" {
				service.SetAcquireHooks(e.srv, hook, nil)
			} else {
				service.SetAcquireHooks(e.srv, nil, hook)
			}
			req := &stockctlv1.AcquireRequest{Name: "gone", Ttl: durationpb.New(5 * time.Minute)}
			if tc.requestID {
				req.RequestId = requestID()
			}
			// The caller gives up once the lock is granted: no deadline,
			// so that only its going away tells the server.
			cctx, cancel := context.WithCancel(ctx(t))
			go func() { <-entered; cancel() }()
			_, err := c.Acquire(cctx, connect.NewRequest(req))
			cancel()
			if connect.CodeOf(err) != connect.CodeCanceled {
				t.Fatalf("Acquire: %v, want CANCELED", err)
			}
			service.SetAcquireHooks(e.srv, nil, nil)
			lockFree(t, c, "gone")
			if live, _ := service.Holds(e.srv); live != 0 {
				t.Fatalf("%d live holds", live)
			}
			if tc.requestID {
				// Nothing is held under it: a Release withdraws it.
				r, err := c.Release(ctx(t), connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{RequestId: req.RequestId}))
				if err != nil || !r.Msg.Withdrawn {
					t.Fatalf("Release by request_id = %v, %v; want withdrawn", r, err)
				}
			}
		})
	}
}

// request_id: a retry answers the same hold (replayed); Release by it
// releases the hold, or withdraws an acquisition that holds nothing
// (unknown yet, or waiting), after which an Acquire with it is refused;
// bad IDs and mixed requests are INVALID_ARGUMENT and change nothing.
func TestAcquireRequestID(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.locks(t, connectJSON)
	acq := func(name, id string, wait *durationpb.Duration) (*stockctlv1.AcquireResponse, error) {
		res, err := c.Acquire(ctx(t), connect.NewRequest(&stockctlv1.AcquireRequest{Name: name, RequestId: id, Ttl: durationpb.New(time.Minute), Wait: wait}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	rel := func(holdID, id string) (*stockctlv1.LockServiceReleaseResponse, error) {
		res, err := c.Release(ctx(t), connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{HoldId: holdID, RequestId: id}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}

	t.Run("retry replays", func(t *testing.T) {
		id := requestID()
		a, err := acq("rq-a", id, nil)
		if err != nil || a.Replayed {
			t.Fatalf("Acquire = %v, %v", a, err)
		}
		b, err := acq("rq-a", id, nil)
		if err != nil || !b.Replayed || b.HoldId != a.HoldId || b.Token != a.Token {
			t.Fatalf("retry = %v, %v; want %s replayed", b, err, a.HoldId)
		}
		_, err = acq("rq-other", id, nil)
		wantError(t, "the ID with another lock", err, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT)
		r, err := rel("", id)
		if err != nil || r.Withdrawn || r.HoldId != a.HoldId || r.Token != a.Token {
			t.Fatalf("Release by request_id = %v, %v", r, err)
		}
		_, err = acq("rq-a", id, nil)
		wantError(t, "Acquire with a released request_id", err, connect.CodeNotFound, stockctlv1.ErrorReason_ERROR_REASON_HOLD_NOT_FOUND)
		lockFree(t, c, "rq-a")
	})
	t.Run("release before the acquire arrives", func(t *testing.T) {
		id := requestID()
		r, err := rel("", id)
		if err != nil || !r.Withdrawn {
			t.Fatalf("Release of an unknown request_id = %v, %v; want withdrawn", r, err)
		}
		_, err = acq("rq-b", id, nil)
		wantError(t, "a late Acquire", err, connect.CodeNotFound, stockctlv1.ErrorReason_ERROR_REASON_HOLD_NOT_FOUND)
		lockFree(t, c, "rq-b")
	})
	t.Run("release while waiting", func(t *testing.T) {
		holder, err := acq("rq-c", requestID(), nil)
		if err != nil {
			t.Fatal(err)
		}
		id := requestID()
		errc := make(chan error, 1)
		go func() { _, err := acq("rq-c", id, nil); errc <- err }()
		waitFor(t, "the second Acquire waiting", func() bool { _, n := service.Holds(e.srv); return n == 1 })
		r, err := rel("", id)
		if err != nil || !r.Withdrawn {
			t.Fatalf("Release while waiting = %v, %v; want withdrawn", r, err)
		}
		wantError(t, "the withdrawn Acquire", <-errc, connect.CodeNotFound, stockctlv1.ErrorReason_ERROR_REASON_HOLD_NOT_FOUND)
		if _, err := rel(holder.HoldId, ""); err != nil {
			t.Fatal(err)
		}
		lockFree(t, c, "rq-c") // not granted to the withdrawn one
	})
	for _, tc := range []struct {
		name    string
		acquire bool
		holdID  string
		id      string
	}{
		{"short ID", true, "", "short"},
		{"ID with a space", true, "", "0123456789 abcdef"},
		{"non-ASCII ID", true, "", "0123456789abcdefé"},
		{"ID too long", true, "", string(make([]byte, 129))},
		{"release by both", false, "h_X", requestID()},
		{"release short ID", false, "", "short"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.acquire {
				_, err = acq("rq-bad", tc.id, nil)
			} else {
				_, err = rel(tc.holdID, tc.id)
			}
			wantError(t, tc.name, err, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT)
		})
	}
	lockFree(t, c, "rq-bad")
	if live, _ := service.Holds(e.srv); live != 0 {
		t.Fatalf("%d live holds after the test", live)
	}
}
