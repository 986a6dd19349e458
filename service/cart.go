package service

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/coordinator"
)

// Orders of several lines (AllocateOrder, ReserveOrder). Their Confirm,
// Cancel and Release are the single-SKU methods called with any line's SKU:
// the coordinator moves the whole order.

func orderLines(ls []*stockctlv1.OrderLine) []coordinator.Line {
	out := make([]coordinator.Line, len(ls))
	for i, l := range ls {
		out[i] = coordinator.Line{SKU: l.GetSku(), Qty: l.GetQty()}
	}
	return out
}

func (h stockService) AllocateOrder(ctx context.Context, req *connect.Request[stockctlv1.AllocateOrderRequest]) (*connect.Response[stockctlv1.AllocateOrderResponse], error) {
	return unary(ctx, h.s, opOrder, stockctlv1connect.StockServiceAllocateOrderProcedure, func(ctx context.Context) (*stockctlv1.AllocateOrderResponse, error) {
		return h.s.allocateOrder(ctx, req.Msg)
	})
}

// allocateOrder is AllocateOrder's work, shared with OrderStream.
func (s *Server) allocateOrder(ctx context.Context, m *stockctlv1.AllocateOrderRequest) (*stockctlv1.AllocateOrderResponse, error) {
	a, err := s.c.AllocateOrder(ctx, m.Order, orderLines(m.Lines), buyerOpts(m.Buyer)...)
	if err != nil {
		return nil, err
	}
	out := &stockctlv1.AllocateOrderResponse{Order: a.Order, Revision: a.Revision, Replayed: a.Replayed,
		Released: a.Released, Buyer: a.Buyer}
	for _, l := range a.Lines {
		out.Lines = append(out.Lines, &stockctlv1.AllocateResponse{Sku: l.SKU, Order: l.Order, Qty: l.Qty,
			Parts: parts(l.Parts), Revision: l.Revision, Replayed: l.Replayed, Released: l.Released, Buyer: l.Buyer})
	}
	return out, nil
}

func (h stockService) ReserveOrder(ctx context.Context, req *connect.Request[stockctlv1.ReserveOrderRequest]) (*connect.Response[stockctlv1.ReserveOrderResponse], error) {
	return unary(ctx, h.s, opOrder, stockctlv1connect.StockServiceReserveOrderProcedure, func(ctx context.Context) (*stockctlv1.ReserveOrderResponse, error) {
		return h.s.reserveOrder(ctx, req.Msg)
	})
}

// reserveOrder is ReserveOrder's work, shared with OrderStream.
func (s *Server) reserveOrder(ctx context.Context, m *stockctlv1.ReserveOrderRequest) (*stockctlv1.ReserveOrderResponse, error) {
	ttl, set, err := duration("ttl", m.Ttl)
	if err != nil {
		return nil, err
	}
	if !set {
		return nil, badField("ttl", "is required: how long the reservation waits for Confirm, e.g. \"900s\"")
	}
	a, err := s.c.ReserveOrder(ctx, m.Order, orderLines(m.Lines), ttl, buyerOpts(m.Buyer)...)
	if err != nil {
		return nil, err
	}
	out := &stockctlv1.ReserveOrderResponse{Order: a.Order, Revision: a.Revision, Replayed: a.Replayed,
		Released: a.Released, Buyer: a.Buyer, State: orderState(a.State), Deadline: timestamp(a.Deadline)}
	for _, l := range a.Lines {
		out.Lines = append(out.Lines, &stockctlv1.ReserveResponse{Sku: l.SKU, Order: l.Order, Qty: l.Qty,
			Parts: parts(l.Parts), Revision: l.Revision, Replayed: l.Replayed, Released: l.Released, Buyer: l.Buyer,
			State: orderState(l.State), Deadline: timestamp(l.Deadline)})
	}
	return out, nil
}

// addRefusedLine adds to ce, an order's refusal, the RefusedLine detail
// (and "line" metadata) when err names the line of an order of several
// SKUs that could not be served.
func addRefusedLine(ce *connect.Error, err error) {
	var le *coordinator.LineError
	if !errors.As(err, &le) {
		return
	}
	addDetail(ce, &stockctlv1.RefusedLine{Index: int32(le.Index), Sku: le.SKU, Qty: le.Qty})
}
