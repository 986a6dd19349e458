// Package etcdwatch keeps a process's view of a key range current: a full
// read, then a watch from the revision after it, and again from a full read
// whenever the watch breaks.
package etcdwatch

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/background"
)

// retryRead is how long Follow waits before reading again after a failed
// read.
const retryRead = 100 * time.Millisecond

// Follow keeps up with the keys under prefix (keys only: the values are not
// read) until ctx ends. It reads them all and hands the answer to load,
// then watches from the revision after that read and hands each response's
// events to apply. When the watch breaks (a compaction, a lost stream) it
// calls broken and starts again with a full read, so no change is missed:
// load must replace the whole view. A failed read is tried again after
// retryRead. load, apply and broken run on Follow's goroutine, one at a
// time.
func Follow(ctx context.Context, kv clientv3.KV, w clientv3.Watcher, prefix string,
	load func(*clientv3.GetResponse), apply func([]*clientv3.Event), broken func()) {
	for ctx.Err() == nil {
		resp, err := kv.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			if !background.Sleep(ctx, retryRead) {
				return
			}
			continue
		}
		load(resp)
		wctx, cancel := context.WithCancel(ctx)
		for wr := range w.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithRev(resp.Header.Revision+1)) {
			if wr.Err() != nil || wr.CompactRevision != 0 {
				break
			}
			apply(wr.Events)
		}
		cancel()
		broken()
	}
}
