package cli

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The kill-by time of the lock watcher. etcd expires a lease TTL after the
// last renewal it received, and it cannot have received one before
// stockctl sent it: so a renewal sent at t and confirmed keeps the lease
// until t+TTL at least, on etcd's clock as on ours (CLOCK_MONOTONIC; a
// remote etcd's clock runs at the same rate). The watcher is told to
// SIGKILL CMD's group, should stockctl die, by t + TTL/2: half the TTL is
// left for the watcher to wake on a busy machine and for the kill to land
// before the next holder can start. It counts from the renewal, not from
// stockctl's death, so it holds however late stockctl's renewals were
// before it died. etcd's client renews every TTL/3 or so; the watcher's
// own renewals, every TTL/6, keep the kill-by time at least TTL/3 ahead:
// enough for the longest --grace (MaxLockGrace) while etcd answers within
// 250 ms.

// renewForKillBy renews lease once and returns the watcher's kill-by time
// for it: TTL/2 after the renewal was sent, on monoNow's clock. ctx bounds
// the renewal.
func renewForKillBy(ctx context.Context, client *clientv3.Client, lease clientv3.LeaseID) (time.Duration, error) {
	sent := monoNow()
	resp, err := client.KeepAliveOnce(ctx, lease)
	if err != nil {
		return 0, err
	}
	return sent + time.Duration(resp.TTL)*time.Second/2, nil
}

// keepKillBy renews lease every ttl/6 and passes each new kill-by time to
// set, until ctx ends. A failed renewal leaves the last time standing: if
// the lease is gone, watchLoss reports it. It returns once it has stopped.
func keepKillBy(ctx context.Context, client *clientv3.Client, lease clientv3.LeaseID, ttl time.Duration, set func(time.Duration)) {
	t := time.NewTicker(ttl / 6)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, ttl)
		killBy, err := renewForKillBy(rctx, client, lease)
		cancel()
		if err == nil {
			set(killBy)
		}
	}
}
