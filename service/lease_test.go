package service_test

import (
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/service"
)

// connectJSON is the protocol of HTTP callers: Connect with JSON over
// HTTP/1.1.
var connectJSON = protocols[1]

func acquireLease(t *testing.T, c stockctlv1connect.LockServiceClient, req *stockctlv1.AcquireRequest) *stockctlv1.AcquireResponse {
	t.Helper()
	res, err := c.Acquire(ctx(t), connect.NewRequest(req))
	if err != nil {
		t.Fatalf("Acquire(%v): %v", req, err)
	}
	return res.Msg
}

// The unary shape: Acquire, KeepAlive, Release (idempotent), and the
// errors of each.
func TestLeaseLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.locks(t, connectJSON)
	a := acquireLease(t, c, &stockctlv1.AcquireRequest{Name: "cron-daily", Ttl: durationpb.New(30 * time.Second)})
	if a.HoldId == "" || a.Token == 0 || a.Key == "" || a.Ttl.AsDuration() != 30*time.Second || a.ExpireTime == nil ||
		a.Kind != stockctlv1.LockKind_LOCK_KIND_EXCLUSIVE {
		t.Fatalf("Acquire = %v", a)
	}
	ka, err := c.KeepAlive(ctx(t), connect.NewRequest(&stockctlv1.KeepAliveRequest{HoldId: a.HoldId}))
	if err != nil || ka.Msg.Token != a.Token || !ka.Msg.ExpireTime.AsTime().After(a.ExpireTime.AsTime().Add(-time.Millisecond)) {
		t.Fatalf("KeepAlive = %v, %v", ka, err)
	}

	_, err = c.Acquire(ctx(t), connect.NewRequest(&stockctlv1.AcquireRequest{Name: "cron-daily", Wait: durationpb.New(50 * time.Millisecond)}))
	wantError(t, "Acquire of a held lock", err, connect.CodeAborted, stockctlv1.ErrorReason_ERROR_REASON_LOCK_BUSY)

	for range 2 { // the second answers the same
		r, err := c.Release(ctx(t), connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{HoldId: a.HoldId}))
		if err != nil || r.Msg.Token != a.Token || r.Msg.Name != "cron-daily" {
			t.Fatalf("Release = %v, %v", r, err)
		}
	}
	_, err = c.KeepAlive(ctx(t), connect.NewRequest(&stockctlv1.KeepAliveRequest{HoldId: a.HoldId}))
	wantError(t, "KeepAlive after Release", err, connect.CodeNotFound, stockctlv1.ErrorReason_ERROR_REASON_HOLD_NOT_FOUND)

	b := acquireLease(t, c, &stockctlv1.AcquireRequest{Name: "cron-daily", Wait: durationpb.New(0)})
	if b.Token <= a.Token {
		t.Fatalf("next token %d, want more than %d", b.Token, a.Token)
	}

	for _, tc := range []struct {
		name   string
		req    *stockctlv1.AcquireRequest
		code   connect.Code
		reason stockctlv1.ErrorReason
	}{
		{"bad name", &stockctlv1.AcquireRequest{Name: "a/b"}, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT},
		{"no name", &stockctlv1.AcquireRequest{}, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT},
		{"ttl too short", &stockctlv1.AcquireRequest{Name: "x", Ttl: durationpb.New(time.Millisecond)}, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT},
		{"negative wait", &stockctlv1.AcquireRequest{Name: "x", Wait: durationpb.New(-time.Second)}, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT},
		{"unknown kind", &stockctlv1.AcquireRequest{Name: "x", Kind: stockctlv1.LockKind(7)}, connect.CodeUnimplemented, stockctlv1.ErrorReason_ERROR_REASON_LOCK_KIND_UNSUPPORTED},
	} {
		_, err := c.Acquire(ctx(t), connect.NewRequest(tc.req))
		wantError(t, tc.name, err, tc.code, tc.reason)
	}
	for _, id := range []string{"", "h_nope"} {
		_, err := c.KeepAlive(ctx(t), connect.NewRequest(&stockctlv1.KeepAliveRequest{HoldId: id}))
		if id == "" {
			wantError(t, "KeepAlive without an ID", err, connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT)
		} else {
			wantError(t, "KeepAlive of an unknown ID", err, connect.CodeNotFound, stockctlv1.ErrorReason_ERROR_REASON_HOLD_NOT_FOUND)
		}
	}
}

// A unary hold not kept alive ends after its ttl: the next caller gets
// the lock with a larger token, and the late caller learns why on its
// next KeepAlive or Release.
func TestLeaseExpiresWithoutKeepAlive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.locks(t, connectJSON)
	a := acquireLease(t, c, &stockctlv1.AcquireRequest{Name: "batch", Ttl: durationpb.New(time.Second)})
	// Waits (no wait field) until the first hold expires.
	b := acquireLease(t, c, &stockctlv1.AcquireRequest{Name: "batch"})
	if b.Token <= a.Token {
		t.Fatalf("next token %d, want more than %d", b.Token, a.Token)
	}
	_, err := c.KeepAlive(ctx(t), connect.NewRequest(&stockctlv1.KeepAliveRequest{HoldId: a.HoldId}))
	wantError(t, "KeepAlive of an expired hold", err, connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_LOCK_LOST)
	if l := detail[*stockctlv1.LockLost](t, err); l.Reason != stockctlv1.LostReason_LOST_REASON_KEEPALIVE_TIMEOUT || l.Token != a.Token {
		t.Errorf("LockLost = %v", l)
	}
	_, err = c.Release(ctx(t), connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{HoldId: a.HoldId}))
	wantError(t, "Release of an expired hold", err, connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_LOCK_LOST)
	if _, err := c.Release(ctx(t), connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{HoldId: b.HoldId})); err != nil {
		t.Fatal(err)
	}
}

// KeepAlive keeps a unary hold past its ttl.
func TestLeaseKeepAlive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.locks(t, connectJSON)
	const ttl = time.Second
	a := acquireLease(t, c, &stockctlv1.AcquireRequest{Name: "kept", Ttl: durationpb.New(ttl)})
	for deadline := time.Now().Add(2 * ttl); time.Now().Before(deadline); time.Sleep(ttl / 20) {
		if _, err := c.KeepAlive(ctx(t), connect.NewRequest(&stockctlv1.KeepAliveRequest{HoldId: a.HoldId})); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.Acquire(ctx(t), connect.NewRequest(&stockctlv1.AcquireRequest{Name: "kept", Wait: durationpb.New(0)}))
	wantError(t, "Acquire of a kept hold", err, connect.CodeAborted, stockctlv1.ErrorReason_ERROR_REASON_LOCK_BUSY)
}

// A server keeps at most MaxHolds unary holds; Close releases them.
func TestLeaseBoundAndClose(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withConfig(func(c *service.Config) { c.MaxHolds = 3 }))
	c := e.locks(t, connectJSON)
	var ids []string
	for _, name := range []string{"a", "b", "c"} {
		ids = append(ids, acquireLease(t, c, &stockctlv1.AcquireRequest{Name: name}).HoldId)
	}
	_, err := c.Acquire(ctx(t), connect.NewRequest(&stockctlv1.AcquireRequest{Name: "d"}))
	wantError(t, "Acquire beyond MaxHolds", err, connect.CodeResourceExhausted, stockctlv1.ErrorReason_ERROR_REASON_TOO_MANY_HOLDS)
	if _, err := c.Release(ctx(t), connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{HoldId: ids[0]})); err != nil {
		t.Fatal(err)
	}
	acquireLease(t, c, &stockctlv1.AcquireRequest{Name: "d"})

	// Another server on the same etcd waits for "b" until this one closes.
	other := newEnv(t, onEtcd(e.etcd))
	got := make(chan error, 1)
	go func() {
		_, err := other.locks(t, connectJSON).Acquire(ctx(t), connect.NewRequest(&stockctlv1.AcquireRequest{Name: "b"}))
		got <- err
	}()
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("Acquire after the holding server closed: %v", err)
	}
}

// A KeepAlive that comes after a hold's ttl has passed, before the server's
// keeper noticed, does not revive the hold: it answers LOCK_LOST
// (KEEPALIVE_TIMEOUT) and the lock goes to the next caller, as if the
// keeper had been on time.
func TestLateKeepAliveDoesNotRevive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.locks(t, connectJSON)
	a := acquireLease(t, c, &stockctlv1.AcquireRequest{Name: "late", Ttl: durationpb.New(time.Minute)})
	service.LapseHold(e.srv, a.HoldId)
	_, err := c.KeepAlive(ctx(t), connect.NewRequest(&stockctlv1.KeepAliveRequest{HoldId: a.HoldId}))
	wantError(t, "KeepAlive after the ttl", err, connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_LOCK_LOST)
	if l := detail[*stockctlv1.LockLost](t, err); l.Reason != stockctlv1.LostReason_LOST_REASON_KEEPALIVE_TIMEOUT || l.Token != a.Token {
		t.Errorf("LockLost = %v", l)
	}
	b := acquireLease(t, c, &stockctlv1.AcquireRequest{Name: "late", Wait: durationpb.New(time.Minute)})
	if b.Token <= a.Token {
		t.Fatalf("next token %d, want more than %d", b.Token, a.Token)
	}
}
