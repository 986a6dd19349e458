package segments

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/keys"
)

// Deleted is the outcome of DeleteSKU.
type Deleted struct {
	SKU string
	// Total, Remaining and Archived are the SKU's books as it was deleted:
	// all stock ever put in, what the pool and segments still held, and
	// what its orders held (all of them archived first).
	Total, Remaining, Archived int64
	// Orders counts the order records the deletion archived and deleted
	// (Pruned before it included).
	Orders int64
	// Revision is the revision of the deleting transaction.
	Revision int64
}

// DeleteSKU deletes a SKU that is done: no live reservation waits for a
// Confirm or its expiry, and no process holds or waits for the lock of its
// pool or of a segment (a process keeps a segment it sold from for up to
// its tenure's idle time, DefaultTenureIdle, after its last order there).
// Otherwise it is ErrConflict, naming the reservation or the lock's holder,
// and changes nothing but what the archive step below already did.
//
// Its order records are first archived as Prune does, whatever their age
// (so their IDs are forgotten), then one transaction deletes the meta
// record, the counters, the archive, the buyers' counters, the restocks'
// delivery records and every other key of the SKU, on condition that
// nothing above changed meanwhile; the delivery IDs are forgotten too. Stock
// still in the pool or the segments goes with it (Deleted says how much).
//
// The name may then be created again. A process that sold the SKU before
// finds out at its next write or look (they compare the SKU's incarnation):
// it answers cleanly, writes nothing, and reads the SKU again.
func (e *Engine) DeleteSKU(ctx context.Context, sku string) (*Deleted, error) {
	if err := ValidateSKU(sku); err != nil {
		return nil, fmt.Errorf("delete %s: %w", sku, err)
	}
	if err := e.checkDone(ctx, sku); err != nil {
		return nil, fmt.Errorf("delete %s: %w", sku, err)
	}
	pruned, err := e.prune(ctx, sku, time.Now().Add(24*time.Hour), 0)
	if err != nil {
		return nil, fmt.Errorf("delete %s: archive its orders: %w", sku, err)
	}
	_, metaRev, err := e.Meta(ctx, sku)
	if err != nil {
		return nil, fmt.Errorf("delete %s: %w", sku, err)
	}
	st, err := e.Status(ctx, sku)
	if err != nil {
		return nil, fmt.Errorf("delete %s: %w", sku, err)
	}
	// The restocks' delivery records go with the SKU, and their ID claims
	// in the same transaction as far as they fit, the rest right after.
	dels, err := e.kv.Get(ctx, e.keys.Deliveries(sku), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("delete %s: %w", sku, err)
	}
	var claims []clientv3.Op
	for _, kv := range dels.Kvs {
		if id, err := e.keys.ParseDelivery(sku, string(kv.Key)); err == nil {
			claims = append(claims, clientv3.OpDelete(e.keys.DeliveryID(id)))
		}
	}
	none := func(prefix string) clientv3.Cmp {
		return clientv3.Compare(clientv3.Version(prefix).WithPrefix(), "=", 0)
	}
	ops := []clientv3.Op{
		clientv3.OpDelete(e.keys.Meta(sku)),
		clientv3.OpDelete(e.keys.SKUStock(sku), clientv3.WithPrefix()),
		clientv3.OpDelete(e.keys.Users(sku), clientv3.WithPrefix()),
		clientv3.OpDelete(e.keys.Archive(sku)),
		clientv3.OpDelete(e.keys.Pull(sku)),
		clientv3.OpDelete(e.keys.Deliveries(sku), clientv3.WithPrefix()),
		clientv3.OpDelete(e.keys.Decisions(sku), clientv3.WithPrefix()),
	}
	now := min(len(claims), max(0, e.cfg.MaxTxnOps-len(ops)))
	ops, claims = append(ops, claims[:now]...), claims[now:]
	resp, err := e.kv.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(e.keys.Meta(sku)), "=", metaRev),
		none(e.keys.StockLocks(sku)),
		none(e.keys.Reservations(sku)),
		none(e.keys.Orders(sku)),
		// No delivery since they were read: its claim would be left behind.
		clientv3.Compare(clientv3.ModRevision(e.keys.Deliveries(sku)).WithPrefix(), "<", dels.Header.Revision+1),
	).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("delete %s: %w", sku, err)
	}
	if !resp.Succeeded {
		if err := e.checkDone(ctx, sku); err != nil {
			return nil, fmt.Errorf("delete %s: %w", sku, err)
		}
		return nil, fmt.Errorf("delete %s: %w: the SKU changed while it was being deleted (an order, a restock or a move): try again", sku, ErrConflict)
	}
	e.mu.Lock()
	delete(e.skus, sku)
	e.mu.Unlock()
	for len(claims) > 0 {
		n := min(len(claims), e.cfg.MaxTxnOps)
		if _, err := e.kv.Txn(ctx).Then(claims[:n]...).Commit(); err != nil {
			return nil, fmt.Errorf("delete %s: the SKU is deleted, but %d of its delivery IDs are still claimed: %w", sku, len(claims), err)
		}
		claims = claims[n:]
	}
	return &Deleted{SKU: sku, Total: st.Total, Remaining: st.Remaining(), Archived: st.Archived,
		Orders: pruned.Archive.Orders, Revision: resp.Header.Revision}, nil
}

// checkDone is ErrConflict, naming the first reason, unless sku has no live
// reservation and no lock key on its places; ErrUnknownSKU if it does not
// exist.
func (e *Engine) checkDone(ctx context.Context, sku string) error {
	resp, err := e.kv.Txn(ctx).Then(
		clientv3.OpGet(e.keys.Meta(sku)),
		clientv3.OpGet(e.keys.StockLocks(sku), clientv3.WithPrefix(), clientv3.WithLimit(1)),
		clientv3.OpGet(e.keys.Reservations(sku), clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return err
	}
	if _, _, err := e.decodeMetaResp(sku, resp.Responses[0].GetResponseRange().Kvs); err != nil {
		return err
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		k, err := e.keys.ParseStockLock(string(kvs[0].Key))
		if err != nil {
			return fmt.Errorf("%w: its lock key %q is held", ErrConflict, kvs[0].Key)
		}
		place := "the pool"
		if k.Kind == keys.KindSegment {
			place = fmt.Sprintf("segment %d", k.Index)
		}
		who := fmt.Sprintf("lease %x", k.Lease)
		if id := string(kvs[0].Value); id != "" {
			who = fmt.Sprintf("%s (lease %x)", id, k.Lease)
		}
		return fmt.Errorf("%w: the lock of %s is held by %s: the SKU is still being sold from (a process keeps a segment for its tenure's idle time after its last order)", ErrConflict, place, who)
	}
	if kvs := resp.Responses[2].GetResponseRange().Kvs; len(kvs) > 0 {
		_, order, _ := e.keys.ParseReservation(sku, string(kvs[0].Key))
		return fmt.Errorf("%w: reservation %q is still live (confirm, cancel or let it expire first)", ErrConflict, order)
	}
	return nil
}
