package service

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/feed"
)

// SnapshotPageEvents is the most events of one WatchOrders message of a
// snapshot. A snapshot of a large sale would not fit a gRPC client's
// default limit of 4 MiB a message (an event is about 200 bytes), so it is
// sent in pages; only the last carries the snapshot's cursor.
const SnapshotPageEvents = 1000

// WatchOrders streams the order feed of package feed: a snapshot first if
// asked, then every batch the feed delivers (empty ones too: their cursor
// keeps a quiet consumer's ahead of compaction), until the caller ends the
// stream or the server shuts down.
func (h stockService) WatchOrders(ctx context.Context, req *connect.Request[stockctlv1.WatchOrdersRequest], stream *connect.ServerStream[stockctlv1.WatchOrdersResponse]) error {
	s := h.s
	method := methodLabel(stockctlv1connect.StockServiceWatchOrdersProcedure)
	m := req.Msg
	if err := checkASCII(m); err != nil {
		return s.fail(ctx, opRead, method, err)
	}
	switch {
	case m.Since < 0:
		return s.fail(ctx, opRead, method, badField("since", "must be a revision from 0 (0: from the start of etcd's history), got "+itoa(m.Since)))
	case m.Snapshot && m.Since != 0:
		return s.fail(ctx, opRead, method, badField("since", "must be 0 with snapshot: a snapshot starts from the current orders"))
	case m.MergedSince != "" && (s.c.Clusters() == nil || m.Sku != ""):
		return s.fail(ctx, opRead, method, badField("merged_since", "is for a stream of every SKU on a server over several etcd clusters; use since"))
	case s.c.Clusters() != nil && m.Sku == "" && (m.Since != 0 || m.Snapshot):
		return s.fail(ctx, opRead, method, badField("since", "a stream of every SKU over several etcd clusters resumes from merged_since, and has no snapshot yet"))
	}
	if err := s.etcdReady(ctx); err != nil {
		return s.fail(ctx, opRead, method, err)
	}
	// The feed's waits end with the stream or when the server shuts down.
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-fctx.Done():
		}
	}()

	// Over several clusters a SKU's feed is its cluster's (its revisions
	// that cluster's); every SKU's is the clusters' feeds merged.
	if s.c.Clusters() != nil && m.Sku == "" {
		return s.watchMerged(ctx, fctx, method, m, stream)
	}
	client := s.skuCluster(ctx, m.Sku).Client()
	cfg := feed.Config{Prefix: s.c.Prefix(), SKU: m.Sku, Since: m.Since}
	// The response headers now, not with the first message, which may be
	// long in coming (a snapshot waits for a page slot): a client's call
	// returns once the stream is open.
	if err := stream.Send(nil); err != nil {
		return err
	}
	if m.Snapshot {
		cursor, err := s.sendSnapshot(fctx, stream, cfg)
		if err != nil {
			return s.feedFail(ctx, method, err)
		}
		cfg.Since = cursor
	}
	f, err := feed.Open(fctx, client, cfg)
	if err != nil {
		return s.feedFail(ctx, method, err)
	}
	defer f.Close()
	for {
		b, err := f.Next(fctx)
		if err != nil {
			return s.feedFail(ctx, method, err)
		}
		if err := stream.Send(&stockctlv1.WatchOrdersResponse{Events: orderEvents(b.Events), Cursor: b.Cursor}); err != nil {
			return err
		}
	}
}

// feedFail ends a WatchOrders stream: nil when the caller ended it,
// SHUTTING_DOWN when the server did, else the feed's error mapped.
func (s *Server) feedFail(ctx context.Context, method string, err error) error {
	switch {
	case ctx.Err() != nil:
		return nil // the caller ended the stream, or its deadline passed
	case s.isClosing():
		return s.fail(ctx, opRead, method, errShuttingDown)
	}
	return s.fail(ctx, opRead, method, feedError(err))
}

// feedError gives the feed's cursor errors their reasons; the rest (an
// unknown SKU, an invalid one, etcd's) map as any call's.
func feedError(err error) error {
	var (
		compacted *feed.CompactedError
		ahead     *feed.AheadError
		ofCluster *feed.ClusterError
	)
	// A merged feed's cursor error is one cluster's: the metadata names it
	// (cluster), and the field is merged_since.
	field, meta := "since", func(m map[string]string) map[string]string { return m }
	if errors.As(err, &ofCluster) {
		field = "merged_since"
		meta = func(m map[string]string) map[string]string {
			if m == nil {
				m = map[string]string{}
			}
			m["cluster"] = ofCluster.Cluster
			return m
		}
	}
	switch {
	case errors.As(err, &compacted):
		return newError(connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_CURSOR_COMPACTED, err,
			meta(map[string]string{"cursor": itoa(compacted.Cursor), "compact_revision": itoa(compacted.CompactRevision)}),
			&stockctlv1.CursorCompacted{Cursor: compacted.Cursor, CompactRevision: compacted.CompactRevision})
	case errors.Is(err, feed.ErrCompacted):
		// A snapshot's revision compacted while it was sent.
		return newError(connect.CodeFailedPrecondition, stockctlv1.ErrorReason_ERROR_REASON_CURSOR_COMPACTED, err, meta(nil),
			&stockctlv1.CursorCompacted{})
	case errors.As(err, &ahead):
		return newError(connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_CURSOR_AHEAD, err,
			meta(map[string]string{"field": field, "cursor": itoa(ahead.Cursor), "revision": itoa(ahead.Current)}),
			&stockctlv1.CursorAhead{Cursor: ahead.Cursor, Revision: ahead.Current},
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: err.Error()}}})
	}
	return err
}

// SnapshotPagesInFlight bounds the snapshot pages a server holds at once,
// over all WatchOrders streams: each is read from etcd when its stream is
// ready for it and held until the stream's caller has taken it (HTTP/2
// flow control), about 1 MB at most (SnapshotPageEvents records, decoded
// and encoded). A snapshot stream waits for a page slot, within its
// caller's deadline; one whose caller does not take its page within
// Config.SnapshotPageTimeout is ended, which frees its slot.
const SnapshotPagesInFlight = 32

// sendSnapshot streams cfg's snapshot page by page from etcd
// (feed.SnapshotPages), each page a message of at most SnapshotPageEvents
// events, the snapshot's cursor on the last (on the only one, empty, when
// there are no orders); it returns the cursor.
func (s *Server) sendSnapshot(ctx context.Context, stream *connect.ServerStream[stockctlv1.WatchOrdersResponse], cfg feed.Config) (int64, error) {
	var cursor int64
	held := false
	free := func() {
		if held {
			<-s.snapshotPages
			held = false
		}
	}
	defer free()
	take := func() error {
		select {
		case s.snapshotPages <- struct{}{}:
			held = true
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	if err := take(); err != nil { // for the first page's read
		return 0, err
	}
	err := feed.SnapshotPages(ctx, s.skuCluster(ctx, cfg.SKU).Client(), cfg, func(b feed.Batch, last bool) error {
		msg := &stockctlv1.WatchOrdersResponse{Events: orderEvents(b.Events), Snapshot: true}
		b.Events = nil
		if last {
			msg.Cursor, cursor = b.Cursor, b.Cursor
		}
		var rc *http.ResponseController
		if rec := recordOf(ctx); rec != nil {
			rc = rec.rc
			_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.SnapshotPageTimeout))
		}
		err := stream.Send(msg)
		if rc != nil {
			_ = rc.SetWriteDeadline(time.Time{})
		}
		if err != nil {
			return &sendError{err}
		}
		free()
		if last {
			return nil
		}
		return take() // for the next page's read
	})
	var se *sendError
	if errors.As(err, &se) {
		return 0, se.err
	}
	return cursor, err
}

// sendError is a failed Send of a snapshot page: the stream is gone.
type sendError struct{ err error }

func (e *sendError) Error() string { return e.err.Error() }

var eventKinds = map[feed.Kind]stockctlv1.OrderEventKind{
	feed.Allocated: stockctlv1.OrderEventKind_ORDER_EVENT_KIND_ALLOCATED,
	feed.Reserved:  stockctlv1.OrderEventKind_ORDER_EVENT_KIND_RESERVED,
	feed.Confirmed: stockctlv1.OrderEventKind_ORDER_EVENT_KIND_CONFIRMED,
	feed.Cancelled: stockctlv1.OrderEventKind_ORDER_EVENT_KIND_CANCELLED,
	feed.Released:  stockctlv1.OrderEventKind_ORDER_EVENT_KIND_RELEASED,
	feed.Expired:   stockctlv1.OrderEventKind_ORDER_EVENT_KIND_EXPIRED,
}

func orderEvents(evs []feed.Event) []*stockctlv1.OrderEvent {
	out := make([]*stockctlv1.OrderEvent, len(evs))
	for i, e := range evs {
		out[i] = &stockctlv1.OrderEvent{
			Revision: e.Revision, Event: eventKinds[e.Kind], Sku: e.SKU, Order: e.Order, Qty: e.Qty,
			Parts: parts(e.Parts), Buyer: e.Buyer, Reservation: e.Reservation,
			Deadline: timestamp(e.Deadline), CreateTime: timestamp(e.Created), Version: e.Version,
			Lines: e.Lines,
		}
	}
	return out
}

// watchMerged streams every SKU's orders of a server over several
// clusters: the clusters' feeds merged (feed.OpenMerged), each message one
// cluster's batch with the merged cursor after it.
func (s *Server) watchMerged(ctx, fctx context.Context, method string, m *stockctlv1.WatchOrdersRequest,
	stream *connect.ServerStream[stockctlv1.WatchOrdersResponse]) error {
	since, err := feed.ParseCursor(m.MergedSince)
	if err != nil {
		return s.fail(ctx, opRead, method, badField("merged_since", err.Error()))
	}
	var clusters []coordinator.Cluster
	for _, name := range s.c.Clusters() {
		clusters = append(clusters, coordinator.Cluster{Name: name, Client: s.c.Cluster(name).Client()})
	}
	removed, err := s.c.RemovedClusters(ctx)
	if err != nil {
		return s.fail(ctx, opRead, method, err)
	}
	f, err := feed.OpenMerged(clusters, feed.Config{Prefix: s.c.Prefix(), Removed: removed}, since)
	if err != nil {
		return s.fail(ctx, opRead, method, mergedSinceError(err, refusedCluster(s.c.Clusters(), removed, since)))
	}
	defer f.Close()
	if err := stream.Send(nil); err != nil { // the headers now, as WatchOrders
		return err
	}
	for {
		b, err := f.Next(fctx)
		if err != nil {
			return s.feedFail(ctx, method, err)
		}
		if err := stream.Send(&stockctlv1.WatchOrdersResponse{Events: orderEvents(b.Events), MergedCursor: b.Merged}); err != nil {
			return err
		}
	}
}

// refusedCluster is the cluster for which OpenMerged refuses since: one
// the server does not have (another fleet's, or one removed from the fleet
// whose order feed's end the cursor has not reached), or, in a cursor that
// is not empty, a removed cluster it does not name; "" when none is.
func refusedCluster(clusters []string, removed map[string]int64, since feed.Cursor) string {
	for _, n := range slices.Sorted(maps.Keys(since)) {
		end, gone := removed[n]
		if !slices.Contains(clusters, n) && (!gone || since[n] < end) {
			return n
		}
	}
	if len(since) > 0 {
		for _, n := range slices.Sorted(maps.Keys(removed)) {
			if rev, ok := since[n]; !ok || rev < removed[n] {
				return n
			}
		}
	}
	return ""
}

// mergedSinceError is a refused merged_since: INVALID_ARGUMENT on the
// field, with the metadata cluster naming the cluster it is refused for,
// so that a client can tell it from a malformed cursor.
func mergedSinceError(err error, cluster string) error {
	if cluster == "" {
		return badField("merged_since", err.Error())
	}
	err = fmt.Errorf("invalid merged_since: %w", err)
	return newError(connect.CodeInvalidArgument, stockctlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, err,
		map[string]string{"field": "merged_since", "cluster": cluster},
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "merged_since", Description: err.Error()}}})
}
