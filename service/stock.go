package service

import (
	"context"

	"connectrpc.com/connect"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/segments"
)

// stockService implements StockService on the coordinator. Each method
// checks what the coordinator does not (durations),
// waits for etcd to be reachable (etcdReady), and leaves every other check
// to the coordinator, which validates before it writes anything.
type stockService struct{ s *Server }

var _ stockctlv1connect.StockServiceHandler = stockService{}

// unary runs one unary call: the etcd gate, f, and the error mapping.
func unary[Res any](ctx context.Context, s *Server, o op, procedure string, f func(ctx context.Context) (*Res, error)) (*connect.Response[Res], error) {
	if err := s.etcdReady(ctx); err != nil {
		return nil, s.fail(ctx, o, methodLabel(procedure), err)
	}
	res, err := f(ctx)
	if err != nil {
		return nil, s.fail(ctx, o, methodLabel(procedure), err)
	}
	return connect.NewResponse(res), nil
}

func buyerOpts(buyer string) []coordinator.OrderOption {
	if buyer == "" {
		return nil
	}
	return []coordinator.OrderOption{coordinator.WithBuyer(buyer)}
}

func (h stockService) CreateSKU(ctx context.Context, req *connect.Request[stockctlv1.CreateSKURequest]) (*connect.Response[stockctlv1.CreateSKUResponse], error) {
	m := req.Msg
	return unary(ctx, h.s, opCreate, stockctlv1connect.StockServiceCreateSKUProcedure, func(ctx context.Context) (*stockctlv1.CreateSKUResponse, error) {
		meta, err := h.s.c.CreateSKU(ctx, m.Sku, coordinator.SKUConfig{
			Total: m.Total, Segments: int(m.Segments), InitialFill: m.InitialFill,
			LowWatermark: m.LowWatermark, RefillBatch: m.RefillBatch, PerUserLimit: m.PerUserLimit,
		})
		if err != nil {
			return nil, err
		}
		return &stockctlv1.CreateSKUResponse{
			Sku: m.Sku, Total: meta.Total, Segments: int32(meta.Segments), InitialFill: meta.InitialFill,
			Pool: meta.Total - meta.InitialFill, LowWatermark: meta.LowWatermark, RefillBatch: meta.RefillBatch,
			PerUserLimit: meta.PerUserLimit, CreateTime: timestamp(meta.Created),
		}, nil
	})
}

func (h stockService) Allocate(ctx context.Context, req *connect.Request[stockctlv1.AllocateRequest]) (*connect.Response[stockctlv1.AllocateResponse], error) {
	return unary(ctx, h.s, opOrder, stockctlv1connect.StockServiceAllocateProcedure, func(ctx context.Context) (*stockctlv1.AllocateResponse, error) {
		return h.s.allocate(ctx, req.Msg)
	})
}

// allocate is Allocate's work, shared with OrderStream.
func (s *Server) allocate(ctx context.Context, m *stockctlv1.AllocateRequest) (*stockctlv1.AllocateResponse, error) {
	a, err := s.c.Allocate(ctx, m.Sku, m.Order, m.Qty, m.RouteKey, buyerOpts(m.Buyer)...)
	if err != nil {
		return nil, err
	}
	return &stockctlv1.AllocateResponse{
		Sku: a.SKU, Order: a.Order, Qty: a.Qty, Parts: parts(a.Parts), Revision: a.Revision,
		Replayed: a.Replayed, Released: a.Released, Buyer: a.Buyer,
	}, nil
}

func (h stockService) Reserve(ctx context.Context, req *connect.Request[stockctlv1.ReserveRequest]) (*connect.Response[stockctlv1.ReserveResponse], error) {
	return unary(ctx, h.s, opOrder, stockctlv1connect.StockServiceReserveProcedure, func(ctx context.Context) (*stockctlv1.ReserveResponse, error) {
		return h.s.reserve(ctx, req.Msg)
	})
}

// reserve is Reserve's work, shared with OrderStream.
func (s *Server) reserve(ctx context.Context, m *stockctlv1.ReserveRequest) (*stockctlv1.ReserveResponse, error) {
	ttl, set, err := duration("ttl", m.Ttl)
	if err != nil {
		return nil, err
	}
	if !set {
		return nil, badField("ttl", "is required: how long the reservation waits for Confirm, e.g. \"900s\"")
	}
	a, err := s.c.Reserve(ctx, m.Sku, m.Order, m.Qty, m.RouteKey, ttl, buyerOpts(m.Buyer)...)
	if err != nil {
		return nil, err
	}
	return &stockctlv1.ReserveResponse{
		Sku: a.SKU, Order: a.Order, Qty: a.Qty, Parts: parts(a.Parts), Revision: a.Revision,
		Replayed: a.Replayed, Released: a.Released, Buyer: a.Buyer, State: orderState(a.State),
		Deadline: timestamp(a.Deadline),
	}, nil
}

func (h stockService) Confirm(ctx context.Context, req *connect.Request[stockctlv1.ConfirmRequest]) (*connect.Response[stockctlv1.ConfirmResponse], error) {
	m := req.Msg
	return unary(ctx, h.s, opStep, stockctlv1connect.StockServiceConfirmProcedure, func(ctx context.Context) (*stockctlv1.ConfirmResponse, error) {
		r, err := h.s.c.Confirm(ctx, m.Sku, m.Order)
		if err != nil {
			return nil, err
		}
		return &stockctlv1.ConfirmResponse{
			Sku: r.SKU, Order: r.Order, Qty: r.Qty, Parts: parts(r.Parts), Revision: r.Revision,
			Replayed: r.Replayed, Buyer: r.Buyer, Deadline: timestamp(r.Deadline),
		}, nil
	})
}

func (h stockService) Cancel(ctx context.Context, req *connect.Request[stockctlv1.CancelRequest]) (*connect.Response[stockctlv1.CancelResponse], error) {
	m := req.Msg
	return unary(ctx, h.s, opStep, stockctlv1connect.StockServiceCancelProcedure, func(ctx context.Context) (*stockctlv1.CancelResponse, error) {
		r, err := h.s.c.Cancel(ctx, m.Sku, m.Order)
		if err != nil {
			return nil, err
		}
		return &stockctlv1.CancelResponse{
			Sku: r.SKU, Order: r.Order, Qty: r.Qty, Parts: parts(r.Parts), Revision: r.Revision,
			Replayed: !r.Released, Buyer: r.Buyer, State: orderState(r.State),
		}, nil
	})
}

// NextExpiry answers the earliest deadline of sku's live reservations
// (Coordinator.NextExpiry); none when none is live.
func (h stockService) NextExpiry(ctx context.Context, req *connect.Request[stockctlv1.NextExpiryRequest]) (*connect.Response[stockctlv1.NextExpiryResponse], error) {
	m := req.Msg
	return unary(ctx, h.s, opRead, stockctlv1connect.StockServiceNextExpiryProcedure, func(ctx context.Context) (*stockctlv1.NextExpiryResponse, error) {
		at, live, err := h.s.c.NextExpiry(ctx, m.Sku)
		if err != nil {
			return nil, err
		}
		return &stockctlv1.NextExpiryResponse{Live: live, Deadline: timestamp(at)}, nil
	})
}

func (h stockService) Release(ctx context.Context, req *connect.Request[stockctlv1.ReleaseRequest]) (*connect.Response[stockctlv1.ReleaseResponse], error) {
	m := req.Msg
	return unary(ctx, h.s, opStep, stockctlv1connect.StockServiceReleaseProcedure, func(ctx context.Context) (*stockctlv1.ReleaseResponse, error) {
		r, err := h.s.c.Release(ctx, m.Sku, m.Order)
		if err != nil {
			return nil, err
		}
		return &stockctlv1.ReleaseResponse{
			Sku: r.SKU, Order: r.Order, Qty: r.Qty, Parts: parts(r.Parts), Revision: r.Revision,
			Replayed: !r.Released, Buyer: r.Buyer, State: orderState(r.State),
		}, nil
	})
}

func (h stockService) Restock(ctx context.Context, req *connect.Request[stockctlv1.RestockRequest]) (*connect.Response[stockctlv1.RestockResponse], error) {
	m := req.Msg
	return unary(ctx, h.s, opStock, stockctlv1connect.StockServiceRestockProcedure, func(ctx context.Context) (*stockctlv1.RestockResponse, error) {
		r, err := h.s.c.Restock(ctx, m.Sku, m.Delivery, m.Qty)
		if err != nil {
			return nil, err
		}
		return &stockctlv1.RestockResponse{Sku: r.SKU, Qty: r.Qty, Total: r.Total, Pool: r.Pool, Revision: r.Revision,
			Replayed: r.Replayed, Delivery: r.Delivery}, nil
	})
}

func (h stockService) Status(ctx context.Context, req *connect.Request[stockctlv1.StatusRequest]) (*connect.Response[stockctlv1.StatusResponse], error) {
	return unary(ctx, h.s, opRead, stockctlv1connect.StockServiceStatusProcedure, func(ctx context.Context) (*stockctlv1.StatusResponse, error) {
		st, err := h.s.c.Status(ctx, req.Msg.Sku)
		if err != nil {
			return nil, err
		}
		return &stockctlv1.StatusResponse{Status: h.s.withLeader(ctx, stockStatus(st))}, nil
	})
}

func (h stockService) Audit(ctx context.Context, req *connect.Request[stockctlv1.AuditRequest]) (*connect.Response[stockctlv1.AuditResponse], error) {
	return unary(ctx, h.s, opRead, stockctlv1connect.StockServiceAuditProcedure, func(ctx context.Context) (*stockctlv1.AuditResponse, error) {
		if err := segments.ValidateSKU(req.Msg.Sku); err != nil {
			return nil, err
		}
		r, err := h.s.c.Audit(ctx, req.Msg.Sku)
		if err != nil {
			return nil, err
		}
		return auditResponse(r), nil
	})
}
