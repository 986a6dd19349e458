package service

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
)

// lockService implements LockService: the unary shape here, the stream
// in hold_stream.go.
type lockService struct{ s *Server }

var _ stockctlv1connect.LockServiceHandler = lockService{}

// maxGrantMargin bounds grantMargin.
const maxGrantMargin = 50 * time.Millisecond

// grantMargin is how long before the call's deadline an Acquire stops
// waiting and grants nothing more: the caller's clock started before the
// request reached the server, so the caller gives up earlier than the
// server's deadline says. A fifth of the time left, at most
// maxGrantMargin.
func grantMargin(left time.Duration) time.Duration {
	return min(maxGrantMargin, max(0, left/5))
}

// Acquire grants a hold. A hold nobody knows of would keep the lock busy
// for its whole ttl, so the grant is guarded three ways: the wait ends
// grantMargin before the call's deadline, and a lock that comes later is
// released; a hold whose caller went away before its answer was sent is
// released by the middleware (front, CALLER_GONE); and a call with a
// request_id can be retried or released by it, which covers the rest (an
// answer sent but never received).
func (h lockService) Acquire(ctx context.Context, req *connect.Request[stockctlv1.AcquireRequest]) (*connect.Response[stockctlv1.AcquireResponse], error) {
	s := h.s
	method := methodLabel(stockctlv1connect.LockServiceAcquireProcedure)
	m := req.Msg
	spec, err := parseLockSpec(m.Name, m.Kind, m.Limit, m.Ttl, m.Wait)
	if err != nil {
		return nil, s.fail(ctx, opLock, method, err)
	}
	var rq *request
	if m.RequestId != "" {
		if err := checkRequestID(m.RequestId); err != nil {
			return nil, s.fail(ctx, opLock, method, err)
		}
		ls, expires, r, err := s.holds.claim(ctx, m.RequestId, spec)
		if err != nil {
			return nil, s.fail(ctx, opLock, method, err)
		}
		if ls != nil {
			return acquired(ls, expires, true), nil
		}
		rq = r
	}
	if err := s.holds.reserve(); err != nil {
		s.holds.dropRequest(rq)
		return nil, s.fail(ctx, opLock, method, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if dl, ok := ctx.Deadline(); ok {
		wctx, cancel = context.WithDeadline(wctx, dl.Add(-grantMargin(time.Until(dl))))
		defer cancel()
	}
	if rq != nil {
		s.holds.setWait(rq, cancel)
	}
	l, err := s.acquire(wctx, spec)
	if err == nil && s.afterGrant != nil {
		s.afterGrant(ctx)
	}
	if err == nil && wctx.Err() != nil {
		// Granted at the end of the caller's time, or after it, or
		// withdrawn: the caller may never learn of it.
		_ = s.unlock(l)
		l, err = nil, context.Cause(wctx)
	}
	if err != nil {
		s.holds.unreserve()
		s.holds.dropRequest(rq)
		if rq != nil && rq.withdrawnNow(s.holds) {
			return nil, s.fail(ctx, opLock, method, withdrawnError(rq.id))
		}
		return nil, lockBusy(s.fail(wctx, opLock, method, err), spec)
	}
	ls, expires, err := s.holds.add(spec, l, rq)
	if err != nil {
		return nil, s.fail(ctx, opLock, method, err)
	}
	if s.beforeAnswer != nil {
		s.beforeAnswer(ctx)
	}
	if rec := recordOf(ctx); rec != nil {
		rec.abandon = func() { s.holds.abandon(ls) }
	}
	return acquired(ls, expires, false), nil
}

func acquired(ls *lease, expires time.Time, replayed bool) *connect.Response[stockctlv1.AcquireResponse] {
	l, spec := ls.l, ls.spec
	return connect.NewResponse(&stockctlv1.AcquireResponse{
		HoldId: ls.id, Name: spec.name, Kind: spec.kind, Token: l.Token(), Key: l.Key(),
		Ttl: durationpb.New(spec.ttl), ExpireTime: timestamppb.New(expires), Limit: int32(spec.limit), Revision: l.Revision(),
		Replayed: replayed,
	})
}

func (h lockService) KeepAlive(ctx context.Context, req *connect.Request[stockctlv1.KeepAliveRequest]) (*connect.Response[stockctlv1.KeepAliveResponse], error) {
	method := methodLabel(stockctlv1connect.LockServiceKeepAliveProcedure)
	if err := checkHoldID(req.Msg.HoldId); err != nil {
		return nil, h.s.fail(ctx, opLock, method, err)
	}
	ls, expires, err := h.s.holds.keepAlive(req.Msg.HoldId)
	if err != nil {
		return nil, h.s.fail(ctx, opLock, method, err)
	}
	return connect.NewResponse(&stockctlv1.KeepAliveResponse{
		HoldId: ls.id, Token: ls.l.Token(), Ttl: durationpb.New(ls.spec.ttl), ExpireTime: timestamppb.New(expires),
	}), nil
}

func (h lockService) Release(ctx context.Context, req *connect.Request[stockctlv1.LockServiceReleaseRequest]) (*connect.Response[stockctlv1.LockServiceReleaseResponse], error) {
	method := methodLabel(stockctlv1connect.LockServiceReleaseProcedure)
	m := req.Msg
	if m.RequestId != "" {
		if m.HoldId != "" {
			return nil, h.s.fail(ctx, opLock, method, badField("request_id", "name the hold by hold_id or by request_id, not both"))
		}
		if err := checkRequestID(m.RequestId); err != nil {
			return nil, h.s.fail(ctx, opLock, method, err)
		}
		name, token, id, withdrawn, err := h.s.holds.releaseRequest(m.RequestId)
		if err != nil {
			return nil, h.s.fail(ctx, opLock, method, err)
		}
		return connect.NewResponse(&stockctlv1.LockServiceReleaseResponse{HoldId: id, Name: name, Token: token, Withdrawn: withdrawn}), nil
	}
	if err := checkHoldID(m.HoldId); err != nil {
		return nil, h.s.fail(ctx, opLock, method, err)
	}
	name, token, err := h.s.holds.release(m.HoldId)
	if err != nil {
		return nil, h.s.fail(ctx, opLock, method, err)
	}
	return connect.NewResponse(&stockctlv1.LockServiceReleaseResponse{HoldId: m.HoldId, Name: name, Token: token}), nil
}

// maxHoldIDLen bounds a hold ID before it is looked up (ours are 28 bytes).
const maxHoldIDLen = 64

func checkHoldID(id string) error {
	if id == "" || len(id) > maxHoldIDLen {
		return badField("hold_id", "must be the hold_id an Acquire answered (or give its request_id)")
	}
	return nil
}
