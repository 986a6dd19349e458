package service

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/anypb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
)

// MaxStreamOrders is the most orders of one OrderStream in flight at once.
// Beyond it the server stops reading the stream until one is answered:
// HTTP/2 flow control then holds the caller back, and a stream never costs
// more than this many goroutines and orders.
const MaxStreamOrders = 1024

// OrderStream runs each order of the stream (Allocate or Reserve, or
// AllocateOrder or ReserveOrder; a
// message may carry several, in more) as its own call on the coordinator,
// side by side, so that the orders of a busy caller share the
// coordinator's group commits, and answers each as soon as it is done,
// with its id and its outcome (the answers ready at one moment in one
// message). The stream ends when the
// caller closes its side and every order has been answered (OK), when the
// caller goes (its deadline, a cancel: orders in flight then finish on the
// server and are not answered), or when the server shuts down
// (SHUTTING_DOWN once the orders in flight are answered).
func (h stockService) OrderStream(ctx context.Context, stream *connect.BidiStream[stockctlv1.OrderStreamRequest, stockctlv1.OrderStreamResponse]) error {
	s := h.s
	method := methodLabel(stockctlv1connect.StockServiceOrderStreamProcedure)
	if err := s.etcdReady(ctx); err != nil {
		return s.fail(ctx, opOrder, method, err)
	}
	// Headers now: the caller's stream is open before its first answer.
	if err := stream.Send(nil); err != nil {
		return err
	}
	done := make(chan struct{})
	defer close(done)
	msgs := make(chan orderMsg)
	go readOrders(stream, msgs, done)

	// One sender sends the answers that are ready together, in one
	// message; it stops at the first failed Send (the stream is gone).
	answers := make(chan *stockctlv1.OrderStreamResponse, MaxStreamOrders)
	var sender sync.WaitGroup
	sender.Go(func() { sendAnswers(stream, answers) })
	var wg sync.WaitGroup
	slots := make(chan struct{}, MaxStreamOrders)
	defer func() {
		wg.Wait()
		close(answers)
		sender.Wait()
	}()
	run := func(req *stockctlv1.OrderStreamRequest) bool {
		// A slot first: at the bound, the stream is not read.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return false
		}
		wg.Go(func() {
			defer func() { <-slots }()
			answers <- s.streamOrder(ctx, method, req)
		})
		return true
	}
	for {
		var msg orderMsg
		select {
		case msg = <-msgs:
		case <-ctx.Done():
			return nil
		case <-s.closing:
			wg.Wait()
			// Expected at a shutdown: not the server's fault, not logged.
			return apiError(ctx, opOrder, errShuttingDown)
		}
		if msg.err != nil {
			if errors.Is(msg.err, io.EOF) {
				return nil
			}
			return msg.err
		}
		if msg.req.Order != nil || len(msg.req.More) == 0 {
			if !run(msg.req) {
				return nil
			}
		}
		for _, req := range msg.req.More {
			if !run(req) {
				return nil
			}
		}
	}
}

// maxAnswersPerMessage bounds the answers sendAnswers puts in one message.
const maxAnswersPerMessage = 256

// sendAnswers sends the answers of a stream as they come, those ready at
// one moment in one message, until answers is closed. After a failed Send
// it only drains answers.
func sendAnswers(stream *connect.BidiStream[stockctlv1.OrderStreamRequest, stockctlv1.OrderStreamResponse], answers <-chan *stockctlv1.OrderStreamResponse) {
	var failed bool
	for first := range answers {
		msg := first
		// A group commit ends many orders of the stream at one moment:
		// yielding once lets their goroutines, runnable now, put their
		// answers in this message rather than in the next ones.
		runtime.Gosched()
	more:
		for len(msg.More) < maxAnswersPerMessage {
			select {
			case a, ok := <-answers:
				if !ok {
					break more
				}
				msg.More = append(msg.More, a)
			default:
				break more
			}
		}
		if !failed && stream.Send(msg) != nil {
			failed = true
		}
	}
}

// streamOrder runs one order of a stream and builds its answer.
func (s *Server) streamOrder(ctx context.Context, method string, req *stockctlv1.OrderStreamRequest) *stockctlv1.OrderStreamResponse {
	res := &stockctlv1.OrderStreamResponse{Id: req.Id}
	var err error
	if len(req.More) > 0 && req.Order == nil {
		err = badField("more", "nested more is not read: put every order of a message in its top level's more")
	}
	if err == nil {
		err = checkASCII(req.GetAllocate())
	}
	if err == nil && req.GetReserve() != nil {
		err = checkASCII(req.GetReserve())
	}
	if err == nil && req.GetAllocateOrder() != nil {
		err = checkASCII(req.GetAllocateOrder())
	}
	if err == nil && req.GetReserveOrder() != nil {
		err = checkASCII(req.GetReserveOrder())
	}
	switch o := req.Order.(type) {
	case nil:
		if err == nil {
			err = badField("order", "each OrderStream request (and each of its more) carries one order: allocate or reserve")
		}
	case *stockctlv1.OrderStreamRequest_Allocate:
		var a *stockctlv1.AllocateResponse
		if err != nil {
			break
		}
		if a, err = s.allocate(ctx, o.Allocate); err == nil {
			res.Outcome = &stockctlv1.OrderStreamResponse_Allocated{Allocated: a}
		}
	case *stockctlv1.OrderStreamRequest_Reserve:
		var r *stockctlv1.ReserveResponse
		if err != nil {
			break
		}
		if r, err = s.reserve(ctx, o.Reserve); err == nil {
			res.Outcome = &stockctlv1.OrderStreamResponse_Reserved{Reserved: r}
		}
	case *stockctlv1.OrderStreamRequest_AllocateOrder:
		var a *stockctlv1.AllocateOrderResponse
		if err != nil {
			break
		}
		if a, err = s.allocateOrder(ctx, o.AllocateOrder); err == nil {
			res.Outcome = &stockctlv1.OrderStreamResponse_AllocatedOrder{AllocatedOrder: a}
		}
	case *stockctlv1.OrderStreamRequest_ReserveOrder:
		var r *stockctlv1.ReserveOrderResponse
		if err != nil {
			break
		}
		if r, err = s.reserveOrder(ctx, o.ReserveOrder); err == nil {
			res.Outcome = &stockctlv1.OrderStreamResponse_ReservedOrder{ReservedOrder: r}
		}
	default:
		err = badField("order", "each OrderStream request (and each of its more) carries one order: allocate or reserve")
	}
	if err != nil {
		res.Outcome = &stockctlv1.OrderStreamResponse_Error{Error: orderError(s.fail(ctx, opOrder, method, err))}
	}
	return res
}

// orderError is a unary call's error as one order's answer in a stream.
func orderError(ce *connect.Error) *stockctlv1.OrderError {
	oe := &stockctlv1.OrderError{Code: ce.Code().String(), Message: ce.Message()}
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if info, ok := v.(*errdetails.ErrorInfo); ok && info.Domain == ErrorDomain {
				oe.Reason = stockctlv1.ErrorReason(stockctlv1.ErrorReason_value["ERROR_REASON_"+info.Reason])
			}
		}
		oe.Details = append(oe.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
	}
	return oe
}

type orderMsg struct {
	req *stockctlv1.OrderStreamRequest
	err error
}

// readOrders reads the stream until it ends, handing each request to the
// handler; it never blocks once the handler has returned (done).
func readOrders(stream *connect.BidiStream[stockctlv1.OrderStreamRequest, stockctlv1.OrderStreamResponse], msgs chan<- orderMsg, done <-chan struct{}) {
	for {
		req, err := stream.Receive()
		select {
		case msgs <- orderMsg{req: req, err: err}:
		case <-done:
			return
		}
		if err != nil {
			return
		}
	}
}

// ListSKUsPageSize is ListSKUs' page size when the request says 0, and
// ListSKUsMaxPageSize its most.
const (
	ListSKUsPageSize    = 100
	ListSKUsMaxPageSize = 1000
)

// ListSKUs pages through the coordinator's list of SKUs: a page token is
// the last SKU of the page before, so a page is right whatever was created
// or deleted since.
func (h stockService) ListSKUs(ctx context.Context, req *connect.Request[stockctlv1.ListSKUsRequest]) (*connect.Response[stockctlv1.ListSKUsResponse], error) {
	m := req.Msg
	return unary(ctx, h.s, opRead, stockctlv1connect.StockServiceListSKUsProcedure, func(ctx context.Context) (*stockctlv1.ListSKUsResponse, error) {
		size := int(m.PageSize)
		switch {
		case size == 0:
			size = ListSKUsPageSize
		case size < 0 || size > ListSKUsMaxPageSize:
			return nil, badField("page_size", "must be 1 to "+itoa(ListSKUsMaxPageSize)+" (0: "+itoa(ListSKUsPageSize)+"), got "+itoa(int64(m.PageSize)))
		}
		after, err := decodePageToken(m.PageToken)
		if err != nil {
			return nil, err
		}
		all, where, err := h.s.skuClusters(ctx)
		if err != nil {
			return nil, err
		}
		i := 0
		if after != "" {
			for i < len(all) && all[i] <= after {
				i++
			}
		}
		page := all[i:min(len(all), i+size)]
		res := &stockctlv1.ListSKUsResponse{Skus: append([]string{}, page...)}
		if where != nil {
			for _, sku := range page {
				res.Clusters = append(res.Clusters, where[sku])
			}
		}
		if i+size < len(all) {
			res.NextPageToken = encodePageToken(page[len(page)-1])
		}
		return res, nil
	})
}

// skuClusters lists every SKU, sorted, and on a server over several
// clusters the cluster that holds each (nil on a server of one). A cluster
// that cannot be read fails the listing, naming it, as Coordinator.SKUs
// does: a list without its SKUs would look whole.
func (s *Server) skuClusters(ctx context.Context) ([]string, map[string]string, error) {
	if s.c.Clusters() == nil {
		all, err := s.c.SKUs(ctx)
		return all, nil, err
	}
	if err := s.clustersReady(ctx); err != nil {
		return nil, nil, err
	}
	var (
		all  []string
		errs []error
	)
	where := map[string]string{}
	for _, l := range s.c.ClusterSKUs(ctx) {
		if l.Err != nil {
			errs = append(errs, l.Err)
			continue
		}
		for _, sku := range l.SKUs {
			all = append(all, sku)
			where[sku] = l.Cluster
		}
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	slices.Sort(all)
	return all, where, nil
}

// A page token is "s1." and the last SKU of the page before, base64url.
const pageTokenPrefix = "s1."

func encodePageToken(last string) string {
	return pageTokenPrefix + base64.RawURLEncoding.EncodeToString([]byte(last))
}

func decodePageToken(t string) (string, error) {
	if t == "" {
		return "", nil
	}
	rest, ok := strings.CutPrefix(t, pageTokenPrefix)
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if !ok || err != nil || len(b) == 0 {
		return "", badField("page_token", "must be a next_page_token a ListSKUs answered (or empty for the first page)")
	}
	return string(b), nil
}

// PrepareMaxSKUs is the most SKU names one Prepare call takes (1,000 of
// up to 64 bytes fit the API's 64 KiB request).
const PrepareMaxSKUs = 1000

// Prepare readies this server's coordinator for a sale of the SKUs
// (Coordinator.Prepare): their first orders here then write one key each.
func (h stockService) Prepare(ctx context.Context, req *connect.Request[stockctlv1.PrepareRequest]) (*connect.Response[stockctlv1.PrepareResponse], error) {
	m := req.Msg
	return unary(ctx, h.s, opRead, stockctlv1connect.StockServicePrepareProcedure, func(ctx context.Context) (*stockctlv1.PrepareResponse, error) {
		if n := len(m.Skus); n == 0 || n > PrepareMaxSKUs {
			return nil, badField("skus", "must name 1 to "+itoa(PrepareMaxSKUs)+" SKUs, got "+itoa(int64(n)))
		}
		p, err := h.s.c.Prepare(ctx, m.Skus...)
		if err != nil {
			return nil, err
		}
		return &stockctlv1.PrepareResponse{Skus: int32(p.SKUs), Ready: int32(p.Ready), Owned: int32(p.Owned), Skipped: int32(p.Skipped)}, nil
	})
}
