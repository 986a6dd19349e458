package segments

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/keys"
)

// SegmentStatus is one segment's stock.
type SegmentStatus struct {
	Index int
	// Remaining is what the segment can give: its counter plus its inbox.
	Remaining int64
	// Inbox is the part of Remaining the rebalancer moved in that the
	// segment's lock holder has not absorbed yet.
	Inbox int64
}

// Status is a SKU's stock at one revision.
type Status struct {
	SKU  string
	Meta Meta
	// Total is all stock ever put in; Pool and Segments is what remains.
	Total    int64
	Pool     int64
	Segments []SegmentStatus
	// Allocated is Total − Pool − Σ Remaining: what active orders hold if
	// the books balance (Audit checks that they do, from the order records).
	// It counts every unit held by orders: plain allocations, confirmed
	// reservations and live reservations.
	Allocated int64
	// Reserved is the part of Allocated held by live reservations (not yet
	// confirmed nor expired), from their index keys; Reservations counts them.
	Reserved     int64
	Reservations int64
	// Orders counts order records, released ones included (not the claims
	// of pruned orders whose IDs are kept: PrunedClaims).
	Orders int64
	// Archived is the part of Allocated held by pruned orders, and
	// ArchivedOrders how many orders were pruned (Prune).
	Archived       int64
	ArchivedOrders int64
	// PrunedClaims counts the pruned orders whose IDs are still kept
	// (KeepPrunedIDs): records under the SKU's orders that hold nothing.
	PrunedClaims int64
	Revision     int64
	// Rebalancer is the last pass of the rebalancer, if one ever ran.
	Rebalancer *RebalancePass
}

// Remaining is the stock left in the pool and all
func (s *Status) Remaining() int64 {
	r := s.Pool
	for _, seg := range s.Segments {
		r += seg.Remaining
	}
	return r
}

// Status reads sku's stock in one transaction, so every figure is from the
// same revision.
func (e *Engine) Status(ctx context.Context, sku string) (*Status, error) {
	if err := ValidateSKU(sku); err != nil {
		return nil, fmt.Errorf("read the status of %s: %w", sku, err)
	}
	resp, err := e.kv.Txn(ctx).Then(
		clientv3.OpGet(e.keys.Meta(sku)),
		clientv3.OpGet(e.keys.SKUStock(sku), clientv3.WithPrefix()),
		clientv3.OpGet(e.keys.Orders(sku), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(e.keys.RebalanceLast()),
		clientv3.OpGet(e.keys.Reservations(sku), clientv3.WithPrefix()),
		clientv3.OpGet(e.keys.Archive(sku)),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("read the status of %s: %w", sku, err)
	}
	meta, info, err := e.decodeMetaResp(sku, resp.Responses[0].GetResponseRange().Kvs)
	if err != nil {
		return nil, fmt.Errorf("read the status of %s: %w", sku, err)
	}
	st := &Status{SKU: sku, Meta: meta, Total: meta.Total, Revision: resp.Header.Revision,
		Segments: make([]SegmentStatus, meta.Segments)}
	for i := range st.Segments {
		st.Segments[i].Index = i
	}
	var lazy []lazySeg
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		k, c, err := e.decodeStockKV(info, kv)
		if err != nil {
			return nil, fmt.Errorf("read the status of %s: %w", sku, err)
		}
		switch k.Kind {
		case keys.KindPool:
			st.Pool = c.N
		case keys.KindSegment:
			st.Segments[k.Index].Remaining += c.N
			if l, ok := lazyOf(k.Index, c, kv.ModRevision); ok {
				lazy = append(lazy, l)
			}
		case keys.KindInbox:
			st.Segments[k.Index].Remaining += c.N
			st.Segments[k.Index].Inbox = c.N
		}
	}
	// Segments sold lazily: their orders since the base are in their
	// records only (SegmentCounter).
	sold, err := e.unsettled(ctx, sku, st.Revision, lazy)
	if err != nil {
		return nil, fmt.Errorf("read the status of %s: %w", sku, err)
	}
	for i, q := range sold {
		st.Segments[i].Remaining -= q
	}
	st.Allocated = st.Total - st.Remaining()
	st.Orders = resp.Responses[2].GetResponseRange().Count
	if kvs := resp.Responses[3].GetResponseRange().Kvs; len(kvs) > 0 {
		pass, err := DecodeRebalancePass(string(kvs[0].Key), kvs[0].Value)
		if err != nil {
			return nil, fmt.Errorf("read the status of %s: %w", sku, err)
		}
		st.Rebalancer = &pass
	}
	for _, kv := range resp.Responses[4].GetResponseRange().Kvs {
		q, err := DecodeCounter(string(kv.Key), kv.Value)
		if err != nil {
			return nil, fmt.Errorf("read the status of %s: %w", sku, err)
		}
		st.Reserved += q
		st.Reservations++
	}
	arc, err := decodeArchiveKVs(resp.Responses[5].GetResponseRange().Kvs)
	if err != nil {
		return nil, fmt.Errorf("read the status of %s: %w", sku, err)
	}
	st.Archived, st.ArchivedOrders = arc.Units, arc.Orders
	st.Orders -= arc.Claims
	st.PrunedClaims = arc.Claims
	return st, nil
}

func (e *Engine) decodeMetaResp(sku string, kvs []*mvccpb.KeyValue) (Meta, *skuInfo, error) {
	if len(kvs) == 0 {
		return Meta{}, nil, ErrUnknownSKU
	}
	meta, err := DecodeMeta(string(kvs[0].Key), kvs[0].Value)
	if err != nil {
		return Meta{}, nil, err
	}
	if meta.Creating {
		return Meta{}, nil, fmt.Errorf("%w: its creation has not completed", ErrUnknownSKU)
	}
	return meta, &skuInfo{name: sku, segments: meta.Segments}, nil
}

// AuditReport is the outcome of an audit.
type AuditReport struct {
	SKU string
	// OK is true when Total = Pool + Segments + Allocated + Archived and
	// nothing was found wrong.
	OK       bool
	Revision int64
	Total    int64
	Pool     int64
	// Segments is the sum of all segments' counters and inboxes.
	Segments int64
	// Allocated is the sum of the quantities of active orders (neither
	// released nor expired): Reserved + Confirmed.
	Allocated int64
	// Reserved is what live reservations hold; Confirmed what the other
	// active orders hold (plain allocations and confirmed reservations).
	Reserved  int64
	Confirmed int64
	// Orders and ReleasedOrders count the order records; ExpiredOrders the
	// reservations that expired.
	Orders         int64
	ReleasedOrders int64
	ExpiredOrders  int64
	// Buyers counts the per-user counters (SKUs with a per-user limit).
	Buyers int64
	// Archived is what pruned orders held (the archive record, see Prune),
	// ArchivedOrders how many were pruned: they count in the balance as
	// Allocated does, without their records.
	Archived       int64
	ArchivedOrders int64
	// PrunedClaims counts the pruned orders whose IDs are still kept
	// (KeepPrunedIDs): records that hold nothing and are not counted in
	// Orders.
	PrunedClaims int64
	// Deliveries counts the restocks recorded by delivery ID; Delivered is
	// the units they added (part of Total).
	Deliveries int64
	Delivered  int64
	// Problems names each offending key and what is wrong with it, and the
	// imbalance if there is one.
	Problems []string
}

// Audit checks sku's books at the current revision: the meta record's total
// must equal the pool, plus every segment's counter and inbox, plus the
// quantities of all active order records, all read in one transaction.
// Every value is decoded strictly, and every order's parts must name places
// of the SKU. Every live reservation must have its index key (with its
// quantity) and every index key a live reservation; every buyer's counter
// must equal the units its active orders counted there hold. Every delivery
// record (Restock) must decode and name the SKU, and the deliveries together
// cannot exceed the total. A failed audit is reported in the report (OK
// false), not as an error; errors are for failing to read.
func (e *Engine) Audit(ctx context.Context, sku string) (*AuditReport, error) {
	return e.AuditAt(ctx, sku, 0)
}

// AuditAt is Audit at a past revision rev (0: the current one). etcd keeps
// past revisions until they are compacted.
func (e *Engine) AuditAt(ctx context.Context, sku string, rev int64) (*AuditReport, error) {
	if err := ValidateSKU(sku); err != nil {
		return nil, fmt.Errorf("audit %s: %w", sku, err)
	}
	at := clientv3.WithRev(rev)
	resp, err := e.kv.Txn(ctx).Then(
		clientv3.OpGet(e.keys.Meta(sku), at),
		clientv3.OpGet(e.keys.SKUStock(sku), clientv3.WithPrefix(), at),
		clientv3.OpGet(e.keys.Orders(sku), clientv3.WithPrefix(), at),
		clientv3.OpGet(e.keys.Reservations(sku), clientv3.WithPrefix(), at),
		clientv3.OpGet(e.keys.Users(sku), clientv3.WithPrefix(), at),
		clientv3.OpGet(e.keys.Deliveries(sku), clientv3.WithPrefix(), at),
		clientv3.OpGet(e.keys.Archive(sku), at),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("audit %s: %w", sku, err)
	}

	meta, info, err := e.decodeMetaResp(sku, resp.Responses[0].GetResponseRange().Kvs)
	if err != nil {
		return nil, fmt.Errorf("audit %s: %w", sku, err)
	}
	r := &AuditReport{SKU: sku, Total: meta.Total, Revision: rev}
	if rev == 0 {
		r.Revision = resp.Header.Revision
	}
	index := map[string]int64{} // reservation index key → qty
	for _, kv := range resp.Responses[3].GetResponseRange().Kvs {
		q, err := DecodeCounter(string(kv.Key), kv.Value)
		if err != nil {
			r.Problems = append(r.Problems, err.Error())
		}
		index[string(kv.Key)] = q
	}
	held := map[string]int64{} // buyer → units of active counted orders
	var lazy []lazySeg
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		k, c, err := e.decodeStockKV(info, kv)
		if err != nil {
			r.Problems = append(r.Problems, err.Error())
			continue
		}
		if k.Kind == keys.KindPool {
			r.Pool = c.N
		} else {
			r.Segments += c.N
		}
		if l, ok := lazyOf(k.Index, c, kv.ModRevision); ok && k.Kind == keys.KindSegment {
			lazy = append(lazy, l)
		}
	}
	// A lazy segment holds its N less the parts of the records created
	// after its base (SegmentCounter).
	if len(lazy) > 0 {
		sold, err := unsettledSales(sku, lazy, resp.Responses[2].GetResponseRange().Kvs)
		if err != nil {
			r.Problems = append(r.Problems, err.Error())
		}
		for _, l := range lazy {
			r.Segments -= sold[l.index]
			if sold[l.index] > l.n {
				r.Problems = append(r.Problems, fmt.Sprintf("segment %d sold %d units since revision %d, more than the %d its counter held", l.index, sold[l.index], l.base, l.n))
			}
		}
	}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		key := string(kv.Key)
		o, err := DecodeOrder(key, kv.Value)
		if err != nil {
			r.Problems = append(r.Problems, err.Error())
			continue
		}
		if id, err := e.keys.ParseOrder(sku, key); err != nil || o.SKU != sku || o.ID != id {
			r.Problems = append(r.Problems, fmt.Sprintf("order record at key %q names SKU %q order %q", key, o.SKU, o.ID))
			continue
		}
		for _, p := range o.Parts {
			if p.Place.Index() >= meta.Segments {
				r.Problems = append(r.Problems, fmt.Sprintf("order record at key %q takes from %v of a SKU with %d segments", key, p.Place, meta.Segments))
			}
		}
		if o.IsPruned() {
			r.PrunedClaims++
			continue
		}
		r.Orders++
		switch {
		case o.State == StateExpired:
			r.ExpiredOrders++
		case o.Released:
			r.ReleasedOrders++
		case o.State == StateReserved:
			r.Allocated += o.Qty
			r.Reserved += o.Qty
		default:
			r.Allocated += o.Qty
			r.Confirmed += o.Qty
		}
		if o.Active() && o.UserCounted {
			held[o.Buyer] += o.Qty
		}
		if o.Reserved() {
			ik := e.keys.Reservation(sku, o.Deadline.UnixNano(), o.ID)
			if q, ok := index[ik]; !ok || q != o.Qty {
				r.Problems = append(r.Problems, fmt.Sprintf("live reservation %q has no index key %q with its qty %d", o.ID, ik, o.Qty))
			}
			delete(index, ik)
		}
	}
	for ik := range index {
		r.Problems = append(r.Problems, fmt.Sprintf("reservation index key %q has no live reservation", ik))
	}
	for _, kv := range resp.Responses[4].GetResponseRange().Kvs {
		key := string(kv.Key)
		buyer, err := e.keys.ParseUser(sku, key)
		if err != nil {
			r.Problems = append(r.Problems, err.Error())
			continue
		}
		v, err := DecodeCounter(key, kv.Value)
		if err != nil {
			r.Problems = append(r.Problems, err.Error())
			continue
		}
		r.Buyers++
		if v != held[buyer] {
			r.Problems = append(r.Problems, fmt.Sprintf("buyer %q's counter is %d, but its active orders hold %d", buyer, v, held[buyer]))
		}
		if meta.PerUserLimit > 0 && v > meta.PerUserLimit {
			r.Problems = append(r.Problems, fmt.Sprintf("buyer %q holds %d, over the per-user limit %d", buyer, v, meta.PerUserLimit))
		}
		delete(held, buyer)
	}
	for buyer, h := range held {
		if h != 0 {
			r.Problems = append(r.Problems, fmt.Sprintf("buyer %q's active orders hold %d, but it has no counter", buyer, h))
		}
	}
	e.auditDeliveries(r, resp.Responses[5].GetResponseRange().Kvs)
	if arc, err := decodeArchiveKVs(resp.Responses[6].GetResponseRange().Kvs); err != nil {
		r.Problems = append(r.Problems, err.Error())
	} else {
		r.Archived, r.ArchivedOrders = arc.Units, arc.Orders
		if arc.Claims != r.PrunedClaims {
			r.Problems = append(r.Problems, fmt.Sprintf("the archive record counts %d kept claims of pruned orders, the records %d", arc.Claims, r.PrunedClaims))
		}
	}
	if sum := r.Pool + r.Segments + r.Allocated + r.Archived; sum != r.Total {
		r.Problems = append(r.Problems, fmt.Sprintf("books do not balance at revision %d: total %d != pool %d + segments %d + allocated %d + archived %d (= %d)",
			r.Revision, r.Total, r.Pool, r.Segments, r.Allocated, r.Archived, sum))
	}
	r.OK = len(r.Problems) == 0
	return r, nil
}

// auditDeliveries counts the SKU's delivery records into r: each must
// decode and name the SKU and the ID of its key, and together they cannot
// have added more than the total (the total is the initial stock plus every
// delivery).
func (e *Engine) auditDeliveries(r *AuditReport, kvs []*mvccpb.KeyValue) {
	for _, kv := range kvs {
		key := string(kv.Key)
		d, err := DecodeDelivery(key, kv.Value)
		if err != nil {
			r.Problems = append(r.Problems, err.Error())
			continue
		}
		if id, err := e.keys.ParseDelivery(r.SKU, key); err != nil || d.SKU != r.SKU || d.ID != id {
			r.Problems = append(r.Problems, fmt.Sprintf("delivery record at key %q names SKU %q delivery %q", key, d.SKU, d.ID))
			continue
		}
		r.Deliveries++
		r.Delivered += d.Qty
	}
	if r.Delivered > r.Total {
		r.Problems = append(r.Problems, fmt.Sprintf("deliveries add up to %d, more than the total %d", r.Delivered, r.Total))
	}
}
