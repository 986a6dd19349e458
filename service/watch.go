package service

import (
	"context"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/internal/engines"
)

// WatchStatus sends a SKU's status, then a new one after every change.
//
// It reads one Status, then watches, from the revision after it, the keys
// a Status is made of: the SKU's meta record (restocks), its stock counters
// and its reservation index. A change only marks the status dirty; the
// loop reads a fresh Status at most once per min_interval and sends it when
// its revision is newer than the last frame's. So a frame is always the
// books at one revision (Status reads in one transaction), frames come in
// revision order, and a burst of changes costs one read, not one per
// change. Order records are not watched: a new order always changes a
// counter too.
func (h stockService) WatchStatus(ctx context.Context, req *connect.Request[stockctlv1.WatchStatusRequest], stream *connect.ServerStream[stockctlv1.WatchStatusResponse]) error {
	s := h.s
	method := methodLabel(stockctlv1connect.StockServiceWatchStatusProcedure)
	sku := req.Msg.Sku
	if err := checkASCII(req.Msg); err != nil {
		return s.fail(ctx, opRead, method, err)
	}
	interval, err := boundedDuration("min_interval", req.Msg.MinInterval, DefaultWatchInterval, MinWatchInterval, MaxWatchInterval)
	if err != nil {
		return s.fail(ctx, opRead, method, err)
	}
	if err := s.etcdReady(ctx); err != nil {
		return s.fail(ctx, opRead, method, err)
	}
	st, err := s.c.Status(ctx, sku)
	if err != nil {
		return s.fail(ctx, opRead, method, err)
	}
	if err := stream.Send(&stockctlv1.WatchStatusResponse{Status: s.withLeader(ctx, stockStatus(st))}); err != nil {
		return err
	}
	last, sent := st.Revision, time.Now()

	// The watch ends with the stream; WithRequireLeader makes it fail,
	// rather than go quiet, when the etcd member loses its cluster.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	changes := s.watchSKU(wctx, sku, last+1)

	var timer *time.Timer
	var due <-chan time.Time // set while a read is scheduled
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil // the caller ended the stream, or its deadline passed
		case <-s.closing:
			return s.fail(ctx, opRead, method, errShuttingDown)
		case werr, ok := <-changes:
			if !ok {
				return nil
			}
			if werr != nil {
				return s.fail(ctx, opRead, method, werr)
			}
			if due != nil {
				continue // a read is already scheduled
			}
			timer = time.NewTimer(max(0, interval-time.Since(sent)))
			due = timer.C
		case <-due:
			due = nil
			st, err := s.c.Status(ctx, sku)
			if err != nil {
				return s.fail(ctx, opRead, method, err)
			}
			sent = time.Now()
			if st.Revision <= last {
				continue
			}
			last = st.Revision
			if err := stream.Send(&stockctlv1.WatchStatusResponse{Status: s.withLeader(ctx, stockStatus(st))}); err != nil {
				return err
			}
		}
	}
}

// watchSKU watches the keys of sku's status from revision rev on and sends
// nil on the returned channel after each change (dropped when one is
// already pending: a change only says "read again"), or the watch's error,
// after which the channel is closed. The channel is also closed when ctx
// ends.
func (s *Server) watchSKU(ctx context.Context, sku string, rev int64) <-chan error {
	out := make(chan error, 1)
	ks := engines.Of(s.c).Keys
	client := s.skuCluster(ctx, sku).Client() // the watch revision rev is that cluster's
	watches := []clientv3.WatchChan{
		client.Watch(ctx, ks.Meta(sku), clientv3.WithRev(rev)),
		client.Watch(ctx, ks.SKUStock(sku), clientv3.WithPrefix(), clientv3.WithRev(rev)),
		client.Watch(ctx, ks.Reservations(sku), clientv3.WithPrefix(), clientv3.WithRev(rev)),
		// The order records: a process selling the SKU lazily
		// (coordinator.WithLazySegments) writes only them, and its sales
		// moved no key watched above until its next settle.
		client.Watch(ctx, ks.Orders(sku), clientv3.WithPrefix(), clientv3.WithRev(rev)),
	}
	merged := make(chan clientv3.WatchResponse)
	for _, w := range watches {
		go func() {
			for resp := range w {
				select {
				case merged <- resp:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case resp := <-merged:
				if err := resp.Err(); err != nil {
					select {
					case out <- err:
					case <-ctx.Done():
					}
					return
				}
				if len(resp.Events) == 0 {
					continue // a progress notification
				}
				select {
				case out <- nil:
				default:
				}
			}
		}
	}()
	return out
}
