package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/api/stockctl/v1/stockctlv1connect"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/internal/etcdcall"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/internal/lock"
)

// inspectService implements InspectService: read-only views of the locks,
// the etcd cluster and this server's order counts, for the console and
// any other client that wants to show them.
type inspectService struct{ s *Server }

var _ stockctlv1connect.InspectServiceHandler = inspectService{}

// inspectTimeout bounds each etcd read of an inspect call: they are
// diagnostics, and a member that does not answer must not hold them up.
const inspectTimeout = 2 * time.Second

func (h inspectService) space() keys.Space { return engines.Of(h.s.c).Keys }

func (h inspectService) ListLocks(ctx context.Context, _ *connect.Request[stockctlv1.ListLocksRequest]) (*connect.Response[stockctlv1.ListLocksResponse], error) {
	return unary(ctx, h.s, opRead, stockctlv1connect.InspectServiceListLocksProcedure, func(ctx context.Context) (*stockctlv1.ListLocksResponse, error) {
		ls, rev, err := h.s.c.Locks(ctx)
		if err != nil {
			return nil, err
		}
		// The identities are the keys' values, at the listing's revision
		// (over several clusters, rev is 0: each cluster's keys now, read
		// in that cluster).
		names := map[string][]string{}
		for _, l := range ls {
			for _, k := range slices.Concat(l.Holders, l.Waiters) {
				if k.Kind != coordinator.KindSemaphore {
					names[l.Cluster] = append(names[l.Cluster], k.Key)
				}
			}
		}
		idents := map[string]string{}
		for cl, ns := range names {
			c := h.s.c
			if cl != "" {
				c = h.s.c.Cluster(cl)
			}
			got, err := h.values(ctx, c.Client(), ns, rev)
			if err != nil {
				return nil, err
			}
			maps.Copy(idents, got)
		}
		res := &stockctlv1.ListLocksResponse{Revision: rev, Locks: []*stockctlv1.LockListing{}}
		for _, l := range ls {
			ll := &stockctlv1.LockListing{Name: l.Name, Semaphore: l.Semaphore, Limit: int32(l.Limit)}
			for _, k := range l.Holders {
				ll.Holders = append(ll.Holders, lockKeyListing(k, idents))
			}
			for _, k := range l.Waiters {
				ll.Waiters = append(ll.Waiters, lockKeyListing(k, idents))
			}
			res.Locks = append(res.Locks, ll)
		}
		return res, nil
	})
}

func lockKeyListing(k coordinator.LockKeyState, idents map[string]string) *stockctlv1.LockKeyListing {
	return &stockctlv1.LockKeyListing{
		Kind: lockKind(k.Kind), Key: k.Key, Lease: strconv.FormatInt(k.Lease, 16), Revision: k.Revision,
		Identity: idents[k.Key], Token: lock.Token(k.Revision, 0),
	}
}

func lockKind(k coordinator.LockKind) stockctlv1.LockKind {
	switch k {
	case coordinator.KindShared:
		return stockctlv1.LockKind_LOCK_KIND_SHARED
	case coordinator.KindSemaphore:
		return stockctlv1.LockKind_LOCK_KIND_SEMAPHORE
	}
	return stockctlv1.LockKind_LOCK_KIND_EXCLUSIVE
}

// values reads the values of ks at rev, in transactions of at most 64 gets
// (etcd's default bound is 128 operations a transaction).
func (h inspectService) values(ctx context.Context, client *clientv3.Client, ks []string, rev int64) (map[string]string, error) {
	out := map[string]string{}
	kv := etcdcall.KV(client)
	for chunk := range slices.Chunk(ks, 64) {
		ops := make([]clientv3.Op, len(chunk))
		for i, k := range chunk {
			ops[i] = clientv3.OpGet(k, clientv3.WithRev(rev))
		}
		resp, err := kv.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("read lock keys: %w", err)
		}
		for _, r := range resp.Responses {
			for _, kv := range r.GetResponseRange().Kvs {
				out[string(kv.Key)] = string(kv.Value)
			}
		}
	}
	return out, nil
}

func (h inspectService) ListPlaceHolders(ctx context.Context, req *connect.Request[stockctlv1.ListPlaceHoldersRequest]) (*connect.Response[stockctlv1.ListPlaceHoldersResponse], error) {
	sku := req.Msg.Sku
	return unary(ctx, h.s, opRead, stockctlv1connect.InspectServiceListPlaceHoldersProcedure, func(ctx context.Context) (*stockctlv1.ListPlaceHoldersResponse, error) {
		if sku == "" || strings.Contains(sku, "/") {
			return nil, badField("sku", "must name a SKU")
		}
		sp := h.space()
		resp, err := etcdcall.KV(h.s.skuCluster(ctx, sku).Client()).Txn(ctx).Then(
			clientv3.OpGet(sp.StockLocks(sku), clientv3.WithPrefix()),
			clientv3.OpGet(sp.Election()+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1)),
		).Commit()
		if err != nil {
			return nil, fmt.Errorf("read the place locks of %s: %w", sku, err)
		}
		var leader int64
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
			leader = electionLease(string(kvs[0].Key))
		}
		type key struct {
			lease    int64
			created  int64
			identity string
		}
		places := map[int][]key{}
		for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
			k, err := sp.ParseStockLock(string(kv.Key))
			if err != nil || k.SKU != sku {
				continue
			}
			places[k.Index] = append(places[k.Index], key{k.Lease, kv.CreateRevision, string(kv.Value)})
		}
		res := &stockctlv1.ListPlaceHoldersResponse{Sku: sku, Revision: resp.Header.Revision, Places: []*stockctlv1.PlaceHolder{}}
		for _, i := range slices.Sorted(mapKeys(places)) {
			ks := places[i]
			slices.SortFunc(ks, func(a, b key) int { return cmp.Compare(a.created, b.created) })
			name := "pool"
			if i >= 0 {
				name = "seg/" + strconv.Itoa(i)
			}
			res.Places = append(res.Places, &stockctlv1.PlaceHolder{
				Place: name, Index: int32(i), Lease: strconv.FormatInt(ks[0].lease, 16), Identity: ks[0].identity,
				Rebalancer: leader != 0 && ks[0].lease == leader, Waiting: int32(len(ks) - 1),
			})
		}
		return res, nil
	})
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// electionLease is the lease an election key ends in (concurrency.Election
// puts "<prefix>/<lease in hexadecimal>"), or 0.
func electionLease(key string) int64 {
	i := strings.LastIndexByte(key, '/')
	n, _ := strconv.ParseInt(key[i+1:], 16, 64)
	return n
}

func (h inspectService) GetCluster(ctx context.Context, _ *connect.Request[stockctlv1.GetClusterRequest]) (*connect.Response[stockctlv1.GetClusterResponse], error) {
	return unary(ctx, h.s, opRead, stockctlv1connect.InspectServiceGetClusterProcedure, func(ctx context.Context) (*stockctlv1.GetClusterResponse, error) {
		client := h.s.c.Client()
		res := &stockctlv1.GetClusterResponse{Prefix: h.s.c.Prefix(), Time: timestamp(time.Now())}
		mctx, cancel := context.WithTimeout(ctx, inspectTimeout)
		defer cancel()
		var members *clientv3.MemberListResponse
		if err := etcdcall.Run(mctx, func(ctx context.Context) (err error) {
			members, err = client.MemberList(ctx)
			return err
		}); err != nil {
			return nil, fmt.Errorf("list etcd members: %w", err)
		}
		eps := client.Endpoints()
		res.Endpoints = make([]*stockctlv1.EtcdEndpoint, len(eps))
		var leader uint64
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i, ep := range eps {
			wg.Go(func() {
				e := &stockctlv1.EtcdEndpoint{Endpoint: ep, Alarms: []string{}}
				var st *clientv3.StatusResponse
				err := etcdcall.Run(mctx, func(ctx context.Context) (err error) {
					st, err = client.Status(ctx, ep)
					return err
				})
				if err != nil {
					e.Error = err.Error()
				} else {
					e.DbSize, e.DbSizeInUse, e.Quota, e.Version = st.DbSize, st.DbSizeInUse, st.DbSizeQuota, st.Version
					for _, s := range st.Errors {
						if _, alarm, ok := strings.Cut(s, "alarm:"); ok {
							e.Alarms = append(e.Alarms, strings.TrimSpace(alarm))
						}
					}
					mu.Lock()
					leader = st.Leader
					mu.Unlock()
				}
				res.Endpoints[i] = e
			})
		}
		wg.Wait()
		for _, m := range members.Members {
			res.Members = append(res.Members, &stockctlv1.EtcdMember{
				Id: strconv.FormatUint(m.ID, 16), Name: m.Name, ClientUrls: m.ClientURLs, PeerUrls: m.PeerURLs,
				Learner: m.IsLearner, Leader: m.ID == leader,
			})
		}
		elect, err := etcdcall.KV(client).Get(mctx, h.space().Election()+"/", clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
		if err != nil {
			return nil, fmt.Errorf("read the rebalancer's election: %w", err)
		}
		if len(elect.Kvs) > 0 {
			res.RebalancerIdentity = string(elect.Kvs[0].Value)
			res.RebalancerLease = strconv.FormatInt(electionLease(string(elect.Kvs[0].Key)), 16)
		}
		res.Revision = elect.Header.Revision
		compact, err := compactRevision(mctx, client, res.Revision)
		if err != nil {
			return nil, err
		}
		res.CompactRevision = compact
		return res, nil
	})
}

// compactRevision finds the oldest revision etcd keeps history from, by a
// binary search of count-only reads of one key at a revision (a compacted
// revision is ErrCompacted): about log2(rev) small reads, where a watch
// from revision 1 would make etcd replay the history.
func compactRevision(ctx context.Context, client *clientv3.Client, rev int64) (int64, error) {
	kv := etcdcall.KV(client)
	compacted := func(r int64) (bool, error) {
		_, err := kv.Get(ctx, "\x00", clientv3.WithRev(r), clientv3.WithCountOnly())
		if errors.Is(err, rpctypes.ErrCompacted) {
			return true, nil
		}
		return false, err
	}
	lo, hi := int64(1), max(rev, 1) // history is kept from hi on; lo may be compacted
	if c, err := compacted(lo); err != nil || !c {
		return lo, err
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		c, err := compacted(mid)
		if err != nil {
			return 0, fmt.Errorf("find etcd's compacted revision: %w", err)
		}
		if c {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi, nil
}

func (h inspectService) GetOrderCounts(ctx context.Context, _ *connect.Request[stockctlv1.GetOrderCountsRequest]) (*connect.Response[stockctlv1.GetOrderCountsResponse], error) {
	return connect.NewResponse(h.s.counts.snapshot()), nil
}

// orderCounts counts the Allocate and Reserve calls a server answered, per
// SKU and outcome: the refusals of a sold-out SKU write nothing to etcd, so
// this is where a client can see how hard buyers still push.
type orderCounts struct {
	since time.Time
	mu    sync.Mutex
	skus  map[string]*stockctlv1.SKUOrderCounts
}

// maxCountedSKUs bounds the SKUs counted, so that calls naming ever new
// SKUs (most of them refused as SKU_NOT_FOUND) cannot grow the map
// forever; calls beyond it are not counted.
const maxCountedSKUs = 100_000

func newOrderCounts() *orderCounts {
	return &orderCounts{since: time.Now(), skus: map[string]*stockctlv1.SKUOrderCounts{}}
}

func (c *orderCounts) add(sku string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.skus[sku]
	if n == nil {
		if len(c.skus) >= maxCountedSKUs {
			return
		}
		n = &stockctlv1.SKUOrderCounts{Sku: sku}
		c.skus[sku] = n
	}
	var ce *connect.Error
	switch {
	case err == nil:
		n.Ok++
	case errors.As(err, &ce) && errorReason(ce) == reason(stockctlv1.ErrorReason_ERROR_REASON_INSUFFICIENT_STOCK):
		n.Refused++
	default:
		n.Failed++
	}
}

func (c *orderCounts) snapshot() *stockctlv1.GetOrderCountsResponse {
	c.mu.Lock()
	defer c.mu.Unlock()
	res := &stockctlv1.GetOrderCountsResponse{Since: timestamp(c.since), Skus: make([]*stockctlv1.SKUOrderCounts, 0, len(c.skus))}
	for _, n := range c.skus {
		res.Skus = append(res.Skus, &stockctlv1.SKUOrderCounts{Sku: n.Sku, Ok: n.Ok, Refused: n.Refused, Failed: n.Failed})
	}
	slices.SortFunc(res.Skus, func(a, b *stockctlv1.SKUOrderCounts) int { return strings.Compare(a.Sku, b.Sku) })
	return res
}

// errorReason is the reason of ce's ErrorInfo, or "".
func errorReason(ce *connect.Error) string {
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if info, ok := v.(interface{ GetReason() string }); ok {
				return info.GetReason()
			}
		}
	}
	return ""
}

// countingInterceptor feeds orderCounts from the answers of Allocate and
// Reserve.
type countingInterceptor struct{ c *orderCounts }

func (i countingInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		switch m := req.Any().(type) {
		case *stockctlv1.AllocateRequest:
			i.c.add(m.GetSku(), err)
		case *stockctlv1.ReserveRequest:
			i.c.add(m.GetSku(), err)
		}
		return res, err
	}
}

func (countingInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (countingInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
