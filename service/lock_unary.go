package service

import (
	"context"

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

func (h lockService) Acquire(ctx context.Context, req *connect.Request[stockctlv1.AcquireRequest]) (*connect.Response[stockctlv1.AcquireResponse], error) {
	s := h.s
	method := methodLabel(stockctlv1connect.LockServiceAcquireProcedure)
	m := req.Msg
	spec, err := parseLockSpec(m.Name, m.Kind, m.Limit, m.Ttl, m.Wait)
	if err != nil {
		return nil, s.fail(ctx, opLock, method, err)
	}
	if err := s.holds.reserve(); err != nil {
		return nil, s.fail(ctx, opLock, method, err)
	}
	l, err := s.acquire(ctx, spec)
	if err != nil {
		s.holds.unreserve()
		return nil, lockBusy(s.fail(ctx, opLock, method, err), spec)
	}
	if ctx.Err() != nil {
		// The caller is gone and will never learn the hold's ID.
		s.holds.unreserve()
		_ = s.unlock(l)
		return nil, s.fail(ctx, opLock, method, context.Cause(ctx))
	}
	ls, expires, err := s.holds.add(spec, l)
	if err != nil {
		return nil, s.fail(ctx, opLock, method, err)
	}
	return connect.NewResponse(&stockctlv1.AcquireResponse{
		HoldId: ls.id, Name: spec.name, Kind: spec.kind, Token: l.Token(), Key: l.Key(),
		Ttl: durationpb.New(spec.ttl), ExpireTime: timestamppb.New(expires), Limit: int32(spec.limit), Revision: l.Revision(),
	}), nil
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
	if err := checkHoldID(req.Msg.HoldId); err != nil {
		return nil, h.s.fail(ctx, opLock, method, err)
	}
	name, token, err := h.s.holds.release(req.Msg.HoldId)
	if err != nil {
		return nil, h.s.fail(ctx, opLock, method, err)
	}
	return connect.NewResponse(&stockctlv1.LockServiceReleaseResponse{HoldId: req.Msg.HoldId, Name: name, Token: token}), nil
}

// maxHoldIDLen bounds a hold ID before it is looked up (ours are 28 bytes).
const maxHoldIDLen = 64

func checkHoldID(id string) error {
	if id == "" || len(id) > maxHoldIDLen {
		return badField("hold_id", "must be the hold_id an Acquire answered")
	}
	return nil
}
