package service

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdcall"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/segments"
)

// Conversions from the coordinator's results to the API's messages, and
// of the API's durations to Go's.

func parts(ps []segments.Part) []*stockctlv1.Part {
	out := make([]*stockctlv1.Part, len(ps))
	for i, p := range ps {
		out[i] = &stockctlv1.Part{Place: p.Place.String(), Qty: p.Qty}
	}
	return out
}

func orderState(s segments.OrderState) stockctlv1.OrderState {
	switch s {
	case "":
		return stockctlv1.OrderState_ORDER_STATE_ALLOCATED
	case segments.StateReserved:
		return stockctlv1.OrderState_ORDER_STATE_RESERVED
	case segments.StateConfirmed:
		return stockctlv1.OrderState_ORDER_STATE_CONFIRMED
	case segments.StateExpired:
		return stockctlv1.OrderState_ORDER_STATE_EXPIRED
	}
	return stockctlv1.OrderState_ORDER_STATE_UNSPECIFIED
}

func stockStatus(st *coordinator.Status) *stockctlv1.StockStatus {
	out := &stockctlv1.StockStatus{
		Sku:            st.SKU,
		Total:          st.Total,
		Pool:           st.Pool,
		Remaining:      st.Remaining(),
		Allocated:      st.Allocated,
		Reserved:       st.Reserved,
		Reservations:   st.Reservations,
		Orders:         st.Orders,
		Revision:       st.Revision,
		Segments:       make([]*stockctlv1.SegmentStatus, len(st.Segments)),
		LowWatermark:   st.Meta.LowWatermark,
		RefillBatch:    st.Meta.RefillBatch,
		PerUserLimit:   st.Meta.PerUserLimit,
		CreateTime:     timestamp(st.Meta.Created),
		Archived:       st.Archived,
		ArchivedOrders: st.ArchivedOrders,
		PrunedClaims:   st.PrunedClaims,
	}
	for i, seg := range st.Segments {
		out.Segments[i] = &stockctlv1.SegmentStatus{Index: int32(seg.Index), Remaining: seg.Remaining, Inbox: seg.Inbox}
	}
	if p := st.Rebalancer; p != nil {
		out.Rebalancer = &stockctlv1.RebalancerPass{
			Leader: p.Leader, Time: timestamp(p.At), Moves: int32(p.Moves), Moved: p.Moved,
			Revision: p.Revision, TotalMoves: int32(p.TotalMoves), TotalMoved: p.TotalMoved,
		}
	}
	return out
}

func auditResponse(r *coordinator.AuditReport) *stockctlv1.AuditResponse {
	return &stockctlv1.AuditResponse{
		Sku: r.SKU, Ok: r.OK, Revision: r.Revision, Total: r.Total, Pool: r.Pool, Segments: r.Segments,
		Allocated: r.Allocated, Reserved: r.Reserved, Confirmed: r.Confirmed, Orders: r.Orders,
		ReleasedOrders: r.ReleasedOrders, ExpiredOrders: r.ExpiredOrders, Buyers: r.Buyers,
		Problems: r.Problems, Deliveries: r.Deliveries, Delivered: r.Delivered,
		Archived: r.Archived, ArchivedOrders: r.ArchivedOrders, PrunedClaims: r.PrunedClaims,
	}
}

// duration converts an optional duration field: set is false when the
// field is absent. A malformed value (out of range, or seconds and nanos of
// opposite signs) is an invalid field.
// maxDurationSeconds is the longest duration field taken whole: a
// time.Duration holds ~292 years.
const maxDurationSeconds = int64(100 * 365 * 24 * 3600)

func duration(field string, d *durationpb.Duration) (v time.Duration, set bool, err error) {
	if d == nil {
		return 0, false, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, true, badField(field, err.Error())
	}
	// Past Go's ~292 years AsDuration saturates, and the bounds' message
	// would echo 2562047h47m16.854775807s for what the caller sent.
	if s := d.GetSeconds(); s > maxDurationSeconds || s < -maxDurationSeconds {
		return 0, true, badField(field, fmt.Sprintf("%ds is far too long (at most %v)", s, time.Duration(maxDurationSeconds)*time.Second))
	}
	return d.AsDuration(), true, nil
}

// boundedDuration is an optional duration field with a default and
// bounds.
func boundedDuration(field string, d *durationpb.Duration, def, lo, hi time.Duration) (time.Duration, error) {
	v, set, err := duration(field, d)
	if err != nil {
		return 0, err
	}
	if !set {
		return def, nil
	}
	if v < lo || v > hi {
		return 0, badField(field, "must be between "+lo.String()+" and "+hi.String()+", got "+v.String())
	}
	return v, nil
}

// withLeader sets st's rebalancer_leader: the identity in the election's
// first key, the leader now (RebalancerPass.leader is who made the last
// pass, perhaps a process gone since). Left empty if it cannot be read.
func (s *Server) withLeader(ctx context.Context, st *stockctlv1.StockStatus) *stockctlv1.StockStatus {
	ks, err := keys.New(s.c.Prefix())
	if err != nil {
		return st
	}
	resp, err := etcdcall.KV(s.skuCluster(ctx, st.Sku).Client()).Get(ctx, ks.Election()+"/", clientv3.WithFirstCreate()...)
	if err == nil && len(resp.Kvs) > 0 {
		st.RebalancerLeader = string(resp.Kvs[0].Value)
	}
	return st
}

// skuCluster is the one-cluster coordinator of sku's cluster, for reads
// the coordinator's API does not offer (the leader, a watch); the server's
// coordinator itself when it has one cluster, or when the cluster cannot
// be found (the read then fails or finds nothing, as it would).
func (s *Server) skuCluster(ctx context.Context, sku string) *coordinator.Coordinator {
	if s.c.Clusters() == nil {
		return s.c
	}
	name, err := s.c.ClusterOf(ctx, sku)
	if err != nil || s.c.Cluster(name) == nil {
		return s.c
	}
	return s.c.Cluster(name)
}
