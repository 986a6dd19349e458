package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
)

// waitForSKU is status --watch on a SKU that does not exist yet: it says
// so (on stderr: the frames on stdout stay frames) and waits for the SKU's
// creation to complete, following its meta key with a watch, until ctx
// ends. Then the state is loaded. Watching before the sale is set up is
// how an operator starts a watch: it should not need a retry loop.
func (w *saleWatch) waitForSKU(ctx context.Context, errs io.Writer) error {
	e := engines.Of(w.coord)
	key := e.Keys.Meta(w.state.sku)
	fmt.Fprintf(errs, "stockctl: status --watch %s: no SKU %s yet under %s; waiting for it to be created (^C to stop)\n",
		w.state.sku, w.state.sku, e.Keys.Prefix())
	for {
		// The watch starts after a read of the key, so that a creation
		// completed between the failed load and here is not missed.
		resp, err := e.KV.Get(ctx, key)
		if err != nil {
			return err
		}
		if len(resp.Kvs) > 0 {
			err := w.state.load(ctx, w.coord)
			if err == nil || !errors.Is(err, coordinator.ErrUnknownSKU) {
				return err // loaded, or a failure a wait cannot cure
			}
		}
		if err := waitForChange(ctx, w.client, key, resp.Header.Revision); err != nil {
			return err
		}
	}
}

// waitForChange returns once key is put after revision rev (or ctx ends,
// or the watch ends: the caller reads again).
func waitForChange(ctx context.Context, client *clientv3.Client, key string, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for resp := range client.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithRev(rev+1)) {
		if resp.Err() != nil {
			return nil
		}
		for _, ev := range resp.Events {
			if ev.Type == mvccpb.PUT {
				return nil
			}
		}
	}
	return ctx.Err()
}
