package feed

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errWatchBroken marks a watch that ended for a reason a new watch from
// the cursor cures: a lost leader, a closed stream.
var errWatchBroken = errors.New("watch broke")

// watch is one etcd watch of the feed's scope, from the cursor at the time
// it was opened.
type watch struct {
	ctx    context.Context // carries the watch's metadata: RequestProgress needs it
	cancel context.CancelFunc
	ch     clientv3.WatchChan
	tick   *time.Ticker // asks for progress; nil for a feed without an end
}

// startWatch opens a watch right after the cursor. WithRequireLeader makes
// a member cut off from its cluster's leader end the watch (the feed then
// opens it again, on any member) rather than leave it silent.
func (f *Feed) startWatch() *watch {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(f.ctx))
	w := &watch{ctx: ctx, cancel: cancel}
	opts := []clientv3.OpOption{clientv3.WithRange(f.scope.end), clientv3.WithRev(f.cursor + 1), clientv3.WithCreatedNotify()}
	if f.until > 0 {
		w.tick = time.NewTicker(progressEvery)
	} else {
		// etcd's periodic progress reports (every 10 minutes by default,
		// --watch-progress-notify-interval) move a quiet feed's cursor.
		opts = append(opts, clientv3.WithProgressNotify())
	}
	w.ch = f.w.Watch(ctx, f.scope.start, opts...)
	return w
}

func (w *watch) stop() {
	w.cancel()
	if w.tick != nil {
		w.tick.Stop()
	}
}

// askProgress asks etcd to report, on the watch, once it has sent every
// event up to its current revision. It is asked only once the cursor has
// reached the latest put before until (lastPut): before that, events are
// known to be on their way, and an etcd 3.4 server older than 3.4.25 could
// send the report ahead of them.
func (f *Feed) askProgress(w *watch) {
	if f.cursor >= f.lastPut {
		// A failure is harmless: the next tick asks again.
		_ = f.w.RequestProgress(w.ctx)
	}
}

// next handles one response of the watch, or one tick. It returns a batch
// of events (maybe none: a progress report, a revision of deletes), or
// errWatchBroken when a new watch would cure the error, or another error.
func (w *watch) next(ctx context.Context, f *Feed) (Batch, error) {
	var tick <-chan time.Time
	if w.tick != nil {
		tick = w.tick.C
	}
	select {
	case <-ctx.Done():
		return Batch{}, context.Cause(ctx)
	case <-tick:
		f.askProgress(w)
		return Batch{}, nil
	case resp, ok := <-w.ch:
		switch {
		case !ok:
			return Batch{}, fmt.Errorf("%w: the watch channel closed", errWatchBroken)
		case resp.CompactRevision != 0:
			return Batch{}, &CompactedError{Cursor: f.cursor, CompactRevision: resp.CompactRevision}
		case resp.Err() != nil:
			if refused(resp.Err()) {
				return Batch{}, resp.Err()
			}
			return Batch{}, fmt.Errorf("%w: %v", errWatchBroken, resp.Err())
		case resp.Created:
			if w.tick != nil {
				f.askProgress(w)
			}
			return Batch{}, nil
		case resp.IsProgressNotify() && f.until > 0:
			// The answer to askProgress: every event up to this revision
			// has been sent (on a current etcd; see askProgress).
			if resp.Header.Revision >= f.until {
				f.progressed = true
			}
			return Batch{}, nil
		case resp.IsProgressNotify():
			// A periodic report. etcd sends it in band, only to a watch
			// that has been sent every event up to its revision (every
			// etcd version), so the cursor can move there. A feed with an
			// end asks for reports instead, and does not trust them so far.
			if rev := resp.Header.Revision; rev > f.cursor {
				f.cursor = rev
				return Batch{Cursor: rev}, nil
			}
			return Batch{}, nil
		}
		return f.take(resp.Events)
	}
}

// refused reports whether etcd refused the watch for a reason that
// another watch would meet again (permissions, credentials).
func refused(err error) bool {
	if errors.Is(err, rpctypes.ErrPermissionDenied) || errors.Is(err, rpctypes.ErrInvalidAuthToken) ||
		errors.Is(err, rpctypes.ErrAuthFailed) {
		return true
	}
	switch status.Code(err) {
	case codes.PermissionDenied, codes.Unauthenticated:
		return true
	}
	return false
}

// errSplit reports a watch response that began in the middle of a revision
// the feed had delivered. etcd never does this (a revision's events come in
// one response); if it did, the feed says so instead of passing over the
// rest of the revision.
var errSplit = errors.New("feed: etcd split a revision across watch responses")

// take turns a watch response's events into a batch, and moves the cursor
// past them. Deletes of order records, and the claims a prune leaves of
// the orders it archives, are not order events: they are passed over, and
// only move the cursor. Events past until are dropped: the feed ends there.
func (f *Feed) take(evs []*clientv3.Event) (Batch, error) {
	var out []Event
	last := f.cursor
	for _, ev := range evs {
		rev := ev.Kv.ModRevision
		switch {
		case rev <= f.cursor:
			return Batch{}, fmt.Errorf("%w: an event of revision %d after the feed delivered revision %d", errSplit, rev, f.cursor)
		case f.until > 0 && rev > f.until:
			f.reached = true
		case ev.Type == mvccpb.DELETE:
			last = rev
		default:
			e, ok, err := decode(f.scope.space, ev.Kv)
			if err != nil {
				return Batch{}, err
			}
			if ok {
				out = append(out, e)
			}
			last = rev
		}
		if f.reached {
			break
		}
	}
	sortEvents(out)
	f.cursor = last
	return Batch{Events: out, Cursor: last}, nil
}
