package service_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdtest"
	"github.com/stockctl/stockctl/service"
)

// A server over two clusters: the API is the same for clients; orders and
// status go to each SKU's cluster; with one cluster stopped its SKUs are
// UNAVAILABLE (ETCD_UNAVAILABLE, naming the cluster) while the other's
// sell on through the same server, and a lock placed in the other cluster
// is still taken.
func TestServiceOverClusters(t *testing.T) {
	a, b := etcdtest.NewSingle(t, etcdtest.WithNoFsync()), etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	coord, err := coordinator.NewClusters(t.Context(), []coordinator.Cluster{
		{Name: "a", Client: a.Client(t)}, {Name: "b", Client: b.Client(t)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = coord.Close() })
	srv, err := service.New(coord, service.Config{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{coord: coord, srv: srv, url: serve(t, srv, nil)}
	c := e.grpcStock(t)
	cx := ctx(t)
	for _, cl := range []string{"a", "b"} {
		if _, err := coord.CreateSKUIn(cx, cl, "in-"+cl, coordinator.SKUConfig{Total: 100, Segments: 2, InitialFill: 100}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Allocate(cx, connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "in-" + cl, Order: "o1", Qty: 2})); err != nil {
			t.Fatalf("allocate in-%s: %v", cl, err)
		}
		st, err := c.Status(cx, connect.NewRequest(&stockctlv1.StatusRequest{Sku: "in-" + cl}))
		if err != nil || st.Msg.Status.Allocated != 2 {
			t.Fatalf("status in-%s: %v %v", cl, st, err)
		}
	}
	// A SKU's order feed is its cluster's; every SKU's at once is refused
	// (the merged feed is not built yet).
	wctx, wcancel := context.WithCancel(cx)
	stream, err := c.WatchOrders(wctx, connect.NewRequest(&stockctlv1.WatchOrdersRequest{Sku: "in-b", Snapshot: true}))
	if err != nil {
		t.Fatal(err)
	}
	seen := false
	for !seen && stream.Receive() {
		for _, ev := range stream.Msg().Events {
			seen = seen || ev.Order == "o1" && ev.Sku == "in-b"
		}
	}
	wcancel()
	stream.Close()
	if !seen {
		t.Fatalf("WatchOrders in-b: no event of o1 (%v)", stream.Err())
	}
	// Every SKU's: the clusters' feeds merged, each message with the
	// merged cursor after it; resumed from the first message's cursor it
	// sends the rest, and nothing of the first again.
	watchAll := func(since string, want int) []*stockctlv1.WatchOrdersResponse {
		t.Helper()
		wctx, wcancel := context.WithCancel(cx)
		defer wcancel()
		st, err := c.WatchOrders(wctx, connect.NewRequest(&stockctlv1.WatchOrdersRequest{MergedSince: since}))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		var msgs []*stockctlv1.WatchOrdersResponse
		n := 0
		for n < want && st.Receive() {
			if len(st.Msg().Events) > 0 {
				msgs = append(msgs, st.Msg())
				n += len(st.Msg().Events)
			}
		}
		if n != want {
			t.Fatalf("WatchOrders of every SKU from %q: %d events (%v), want %d", since, n, st.Err(), want)
		}
		return msgs
	}
	msgs := watchAll("", 2) // o1 of in-a and of in-b
	skusSeen := map[string]bool{}
	for _, m := range msgs {
		if m.MergedCursor == "" || m.Cursor != 0 {
			t.Fatalf("a merged message's cursors: %q, %d", m.MergedCursor, m.Cursor)
		}
		for _, ev := range m.Events {
			skusSeen[ev.Sku] = true
		}
	}
	if !skusSeen["in-a"] || !skusSeen["in-b"] {
		t.Fatalf("merged WatchOrders saw %v, want both clusters' SKUs", skusSeen)
	}
	if _, err := c.Allocate(cx, connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "in-a", Order: "o-late", Qty: 1})); err != nil {
		t.Fatal(err)
	}
	first := msgs[0]
	rest := watchAll(first.MergedCursor, 2) // the other cluster's o1, and o-late
	for _, m := range rest {
		for _, ev := range m.Events {
			for _, old := range first.Events {
				if ev.Sku == old.Sku && ev.Order == old.Order && ev.Revision == old.Revision {
					t.Fatalf("resumed from %q: %s/%s sent again", first.MergedCursor, ev.Sku, ev.Order)
				}
			}
		}
	}
	// A SKU created through the API lands in one cluster.
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "via-api", Total: 10, Segments: 1, InitialFill: 10})
	if where, err := coord.ClusterOf(cx, "via-api"); err != nil || where == "" {
		t.Fatalf("via-api: cluster %q, %v", where, err)
	}
	var lockA string
	for i := 0; lockA == ""; i++ {
		name := "lk" + string(rune('a'+i))
		l, err := coord.Lock(cx, name)
		if err != nil {
			t.Fatal(err)
		}
		ls, _, err := coord.Locks(cx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ls {
			if s.Name == name && s.Cluster == "a" {
				lockA = name
			}
		}
		l.Unlock(cx)
	}

	// The console's lock listing covers both clusters, with each holder's
	// identity read in its own cluster.
	held := map[string]*coordinator.Lock{}
	in := map[string]bool{} // the clusters a held lock lives in
	for i := 0; len(in) < 2; i++ {
		name := "held" + string(rune('a'+i))
		l, err := coord.Lock(cx, name)
		if err != nil {
			t.Fatal(err)
		}
		held[name] = l
		ls, _, err := coord.Locks(cx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ls {
			in[s.Cluster] = true
		}
	}
	insp := stockctlv1connect.NewInspectServiceClient(httpClient(t, false, ""), e.url, connect.WithProtoJSON())
	ll, err := insp.ListLocks(cx, connect.NewRequest(&stockctlv1.ListLocksRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, lk := range ll.Msg.Locks {
		if held[lk.Name] != nil && len(lk.Holders) == 1 && lk.Holders[0].Identity != "" {
			found++
		}
	}
	if found != len(held) {
		t.Fatalf("ListLocks: %v, want %d held locks with identities", ll.Msg.Locks, len(held))
	}
	for _, l := range held {
		l.Unlock(cx)
	}

	b.Stop()
	short, cancel := context.WithTimeout(cx, 3*time.Second)
	_, err = c.Allocate(short, connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "in-b", Order: "o2", Qty: 1}))
	cancel()
	code, reason := errorInfo(t, err)
	if code != connect.CodeUnavailable || reason != "ETCD_UNAVAILABLE" || !strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("allocate on stopped cluster b: %v (code %v, reason %s), want UNAVAILABLE ETCD_UNAVAILABLE naming b", err, code, reason)
	}
	for i := range 10 {
		if _, err := c.Allocate(cx, connect.NewRequest(&stockctlv1.AllocateRequest{Sku: "in-a", Order: "a" + string(rune('0'+i)), Qty: 1})); err != nil {
			t.Fatalf("allocate on cluster a while b is stopped: %v", err)
		}
	}
	l := e.grpcLocks(t)
	resp, err := l.Acquire(cx, connect.NewRequest(&stockctlv1.AcquireRequest{Name: lockA}))
	if err != nil {
		t.Fatalf("acquire %s (cluster a) while b is stopped: %v", lockA, err)
	}
	if _, err := l.Release(cx, connect.NewRequest(&stockctlv1.LockServiceReleaseRequest{HoldId: resp.Msg.HoldId})); err != nil {
		t.Fatal(err)
	}
}

// A merged feed's refused cursor names its cluster: CURSOR_COMPACTED with
// the metadata cluster for one compacted past the cursor, and
// INVALID_ARGUMENT with field merged_since and cluster for a cluster the
// server does not have (a client tells it from a malformed cursor).
func TestWatchOrdersMergedRefusedCursorsNameTheCluster(t *testing.T) {
	a, b := etcdtest.NewSingle(t, etcdtest.WithNoFsync()), etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	ca := a.Client(t)
	coord, err := coordinator.NewClusters(t.Context(), []coordinator.Cluster{{Name: "a", Client: ca}, {Name: "b", Client: b.Client(t)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = coord.Close() })
	srv, err := service.New(coord, service.Config{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{coord: coord, srv: srv, url: serve(t, srv, nil)}
	c := e.grpcStock(t)
	cx := ctx(t)
	var rev int64
	for range 3 {
		resp, err := ca.Put(cx, "/compact-me", "x")
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	if _, err := ca.Compact(cx, rev); err != nil {
		t.Fatal(err)
	}
	watchErr := func(since string) error {
		st, err := c.WatchOrders(cx, connect.NewRequest(&stockctlv1.WatchOrdersRequest{MergedSince: since}))
		if err != nil {
			return err
		}
		defer st.Close()
		for st.Receive() {
		}
		return st.Err()
	}
	meta := func(err error) map[string]string {
		var ce *connect.Error
		if errors.As(err, &ce) {
			for _, d := range ce.Details() {
				if v, derr := d.Value(); derr == nil {
					if info, ok := v.(*errdetails.ErrorInfo); ok {
						return info.Metadata
					}
				}
			}
		}
		return nil
	}
	err = watchErr("a=1")
	if code, reason := errorInfo(t, err); code != connect.CodeFailedPrecondition || reason != "CURSOR_COMPACTED" {
		t.Fatalf("a compacted cursor of a: %v", err)
	}
	if m := meta(err); m["cluster"] != "a" || m["cursor"] != "1" || m["compact_revision"] != fmt.Sprint(rev) {
		t.Fatalf("a compacted cursor of a: metadata %v", m)
	}
	if d := detail[*stockctlv1.CursorCompacted](t, err); d.Cursor != 1 || d.CompactRevision != rev {
		t.Fatalf("CursorCompacted %v", d)
	}
	err = watchErr("a=" + fmt.Sprint(rev) + ",gone=7")
	if code, reason := errorInfo(t, err); code != connect.CodeInvalidArgument || reason != "INVALID_ARGUMENT" {
		t.Fatalf("a cursor naming cluster gone: %v", err)
	}
	if m := meta(err); m["cluster"] != "gone" || m["field"] != "merged_since" || !strings.Contains(err.Error(), `"gone"`) {
		t.Fatalf("a cursor naming cluster gone: metadata %v, %v", m, err)
	}
	err = watchErr("nonsense")
	if m := meta(err); m["field"] != "merged_since" || m["cluster"] != "" {
		t.Fatalf("a malformed cursor: metadata %v, %v", m, err)
	}
}

// ListSKUs over several clusters lists every cluster's SKUs, in name
// order across the clusters and pages, and says which cluster holds each.
func TestListSKUsOverClustersNamesTheCluster(t *testing.T) {
	a, b := etcdtest.NewSingle(t, etcdtest.WithNoFsync()), etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	coord, err := coordinator.NewClusters(t.Context(), []coordinator.Cluster{{Name: "a", Client: a.Client(t)}, {Name: "b", Client: b.Client(t)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = coord.Close() })
	srv, err := service.New(coord, service.Config{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{coord: coord, srv: srv, url: serve(t, srv, nil)}
	c := e.grpcStock(t)
	cx := ctx(t)
	want := map[string]string{}
	for i, cl := range []string{"a", "b", "a", "b", "b"} {
		sku := fmt.Sprintf("s%d-%s", i, cl)
		if _, err := coord.CreateSKUIn(cx, cl, sku, coordinator.SKUConfig{Total: 10, Segments: 1, InitialFill: 10}); err != nil {
			t.Fatal(err)
		}
		want[sku] = cl
	}
	createSKU(t, c, &stockctlv1.CreateSKURequest{Sku: "hashed", Total: 10, Segments: 1, InitialFill: 10})
	where, err := coord.ClusterOf(cx, "hashed")
	if err != nil {
		t.Fatal(err)
	}
	want["hashed"] = where
	got := map[string]string{}
	var order []string
	token := ""
	for {
		res, err := c.ListSKUs(cx, connect.NewRequest(&stockctlv1.ListSKUsRequest{PageSize: 2, PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Msg.Clusters) != len(res.Msg.Skus) {
			t.Fatalf("page %v: clusters %v", res.Msg.Skus, res.Msg.Clusters)
		}
		for i, sku := range res.Msg.Skus {
			got[sku] = res.Msg.Clusters[i]
			order = append(order, sku)
		}
		if token = res.Msg.NextPageToken; token == "" {
			break
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || !slices.IsSorted(order) || len(order) != len(want) {
		t.Fatalf("ListSKUs: %v in order %v, want %v", got, order, want)
	}
	// A cluster that cannot be read fails the listing, naming it: a list
	// without its SKUs would look whole.
	b.Stop()
	short, cancel := context.WithTimeout(cx, 3*time.Second)
	defer cancel()
	_, err = c.ListSKUs(short, connect.NewRequest(&stockctlv1.ListSKUsRequest{}))
	if code, reason := errorInfo(t, err); code != connect.CodeUnavailable || reason != "ETCD_UNAVAILABLE" || !strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("ListSKUs with cluster b stopped: %v", err)
	}
}

// A merged cursor that would skip a removed cluster's events (one that
// does not name it) is refused naming it; one at its feed's end resumes.
func TestWatchOrdersMergedCursorOfRemovedCluster(t *testing.T) {
	a, b, gone := etcdtest.NewSingle(t, etcdtest.WithNoFsync()), etcdtest.NewSingle(t, etcdtest.WithNoFsync()), etcdtest.NewSingle(t, etcdtest.WithNoFsync())
	ca, cb := a.Client(t), b.Client(t)
	old, err := coordinator.NewClusters(t.Context(), []coordinator.Cluster{{Name: "a", Client: ca}, {Name: "b", Client: cb}, {Name: "gone", Client: gone.Client(t)}})
	if err != nil {
		t.Fatal(err)
	}
	rm, err := old.RemoveCluster(t.Context(), "gone", coordinator.RemoveClusterOptions{MoveLocks: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = old.Close()
	coord, err := coordinator.NewClusters(t.Context(), []coordinator.Cluster{{Name: "a", Client: ca}, {Name: "b", Client: cb}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = coord.Close() })
	srv, err := service.New(coord, service.Config{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{coord: coord, srv: srv, url: serve(t, srv, nil)}
	c := e.grpcStock(t)
	watch := func(since string) error {
		wctx, cancel := context.WithTimeout(ctx(t), time.Second)
		defer cancel()
		st, err := c.WatchOrders(wctx, connect.NewRequest(&stockctlv1.WatchOrdersRequest{MergedSince: since}))
		if err != nil {
			return err
		}
		defer st.Close()
		for st.Receive() {
		}
		if wctx.Err() != nil {
			return nil // open until the deadline: resumed
		}
		return st.Err()
	}
	err = watch("a=1")
	if code, reason := errorInfo(t, err); code != connect.CodeInvalidArgument || reason != "INVALID_ARGUMENT" || !strings.Contains(err.Error(), `"gone"`) {
		t.Fatalf("a cursor without the removed cluster: %v", err)
	}
	var ce *connect.Error
	errors.As(err, &ce)
	found := false
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if info, ok := v.(*errdetails.ErrorInfo); ok {
				found = info.Metadata["cluster"] == "gone" && info.Metadata["field"] == "merged_since"
			}
		}
	}
	if !found {
		t.Fatalf("a cursor without the removed cluster: no metadata cluster gone: %v", err)
	}
	if err := watch(fmt.Sprintf("a=1,gone=%d", rm.FeedEnd)); err != nil {
		t.Fatalf("a cursor at the removed cluster's end: %v", err)
	}
}
