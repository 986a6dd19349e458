package bench

import (
	"context"
	"errors"
	"runtime"
	"sync"

	"connectrpc.com/connect"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
)

// orderPipe sends the orders of many buyers on one StockService.OrderStream
// and hands each answer to the buyer that waits for it, by id: what a busy
// caller of the API does instead of one call per order. A broken stream
// fails the orders waiting on it (their buyers retry them with the same
// order IDs, as after any error) and is opened again by the next order.
type orderPipe struct {
	client stockctlv1connect.StockServiceClient
	ctx    context.Context // the streams' (the run's)
	wake   chan struct{}   // the sender has orders to send

	mu      sync.Mutex // the fields below
	stream  *connect.BidiStreamForClient[stockctlv1.OrderStreamRequest, stockctlv1.OrderStreamResponse]
	next    int64
	queue   []*stockctlv1.OrderStreamRequest // to send, in one message
	waiting map[int64]chan *stockctlv1.OrderStreamResponse
	wg      sync.WaitGroup // the sender and receivers
}

func newOrderPipe(ctx context.Context, c stockctlv1connect.StockServiceClient) *orderPipe {
	p := &orderPipe{client: c, ctx: ctx, wake: make(chan struct{}, 1), waiting: map[int64]chan *stockctlv1.OrderStreamResponse{}}
	p.wg.Go(p.send)
	return p
}

// send sends the queued orders, all those queued at one moment in one
// message (as the server does with its answers), until the pipe's ctx ends.
func (p *orderPipe) send() {
	for {
		select {
		case <-p.wake:
		case <-p.ctx.Done():
			return
		}
		// One answer message wakes many buyers at once, and the first to
		// queue its next order wakes this sender. Yielding once lets the
		// others, runnable now, queue theirs: their orders then share one
		// message (about 10 an order message at 20 × 200, against 1.4
		// without the yield, and ~20 % less CPU per order over all
		// processes: docs/benchmarks.md).
		runtime.Gosched()
		p.mu.Lock()
		q := p.queue
		p.queue = nil
		s := p.stream
		if s == nil && len(q) > 0 {
			s = p.client.OrderStream(p.ctx)
			p.stream = s
			p.wg.Go(func() { p.receive(s) })
		}
		p.mu.Unlock()
		if len(q) == 0 {
			continue
		}
		msg := q[0]
		if len(q) > 1 {
			msg = &stockctlv1.OrderStreamRequest{More: q}
		}
		if err := s.Send(msg); err != nil {
			p.mu.Lock()
			p.breakLocked(s)
			p.mu.Unlock()
		}
	}
}

// allocate queues one Allocate for the stream and waits for its answer
// (within ctx: a buyer that gives up leaves it to be dropped on arrival).
func (p *orderPipe) allocate(ctx context.Context, req *stockctlv1.AllocateRequest) (*stockctlv1.OrderStreamResponse, error) {
	ch := make(chan *stockctlv1.OrderStreamResponse, 1)
	p.mu.Lock()
	p.next++
	id := p.next
	p.waiting[id] = ch
	p.queue = append(p.queue, &stockctlv1.OrderStreamRequest{Id: id, Order: &stockctlv1.OrderStreamRequest_Allocate{Allocate: req}})
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default: // the sender is awake already
	}
	select {
	case res := <-ch:
		if res == nil {
			return nil, errors.New("order stream broke before the answer")
		}
		return res, nil
	case <-ctx.Done():
		p.mu.Lock()
		delete(p.waiting, id)
		p.mu.Unlock()
		return nil, context.Cause(ctx)
	}
}

// receive hands out s's answers until it ends, then fails its waiters.
func (p *orderPipe) receive(s *connect.BidiStreamForClient[stockctlv1.OrderStreamRequest, stockctlv1.OrderStreamResponse]) {
	for {
		res, err := s.Receive()
		if err != nil { // the waiters learn of it below
			p.mu.Lock()
			p.breakLocked(s)
			p.mu.Unlock()
			_ = s.CloseResponse()
			return
		}
		all := res.More
		if res.Outcome != nil {
			all = append(all, res)
		}
		p.mu.Lock()
		for _, r := range all {
			if ch := p.waiting[r.Id]; ch != nil {
				delete(p.waiting, r.Id)
				ch <- r
			}
		}
		p.mu.Unlock()
	}
}

// breakLocked drops s (if it is still the pipe's) and fails every waiter
// of it. Called under mu.
func (p *orderPipe) breakLocked(s *connect.BidiStreamForClient[stockctlv1.OrderStreamRequest, stockctlv1.OrderStreamResponse]) {
	if p.stream != s {
		return
	}
	_ = s.CloseRequest()
	p.stream = nil
	for id, ch := range p.waiting {
		ch <- nil
		delete(p.waiting, id)
	}
}

// close ends the pipe's stream (the server answers the orders in flight,
// then ends it) and waits for its goroutines, within the pipe's ctx.
func (p *orderPipe) close() {
	p.mu.Lock()
	if p.stream != nil {
		_ = p.stream.CloseRequest()
	}
	p.mu.Unlock()
}

// wait waits for the pipe's goroutines (once its ctx has ended).
func (p *orderPipe) wait() { p.wg.Wait() }

// orderError is an order's error from a stream as the error a unary call
// would have returned: a connect error with the same code and details.
func orderError(oe *stockctlv1.OrderError) error {
	var code connect.Code
	if err := code.UnmarshalText([]byte(oe.Code)); err != nil {
		code = connect.CodeUnknown
	}
	ce := connect.NewError(code, errors.New(oe.Message))
	for _, d := range oe.Details {
		if m, err := d.UnmarshalNew(); err == nil {
			if ed, err := connect.NewErrorDetail(m); err == nil {
				ce.AddDetail(ed)
			}
		}
	}
	return ce
}
