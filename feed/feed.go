package feed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/internal/etcdcall"
)

// Batch is the events of one or more whole revisions, in feed order.
type Batch struct {
	// Events may be empty: the cursor moved past revisions with nothing
	// to deliver (deleted records, or etcd's periodic report that nothing
	// in scope changed up to a revision). Store the Cursor all the same: it
	// keeps a quiet feed's cursor from falling behind etcd's compaction.
	Events []Event
	// Cursor is the revision to store once the batch is applied: every
	// event with a revision up to Cursor has been delivered, in this batch
	// or before.
	Cursor int64
}

// Feed delivers the changes to orders, in revision order, with no gap and
// no duplicate. Next is not safe for concurrent use; Close is, and may be
// called while Next waits.
type Feed struct {
	scope scope
	kv    clientv3.KV
	w     clientv3.Watcher
	log   *slog.Logger

	until   int64 // 0: no end
	lastPut int64 // see Open: the latest put in scope at or before until

	ctx    context.Context // the watches' context, ended by Close
	cancel context.CancelFunc
	closed atomic.Bool

	// Owned by the goroutine calling Next.
	cursor     int64
	watch      *watch // nil when none is open
	progressed bool   // etcd said every event up to until was sent
	reached    bool   // an event past until came: every one up to it did
	done       bool
	restarts   atomic.Int64
}

// Open starts a feed of cfg's orders after cfg.Since. It checks, in one
// read bounded by ctx, that the SKU exists (ErrUnknownSKU) and that the
// cursor is not ahead of etcd (*AheadError); a cursor older than etcd's
// compaction is reported by the first Next (*CompactedError), as etcd
// tells it when the watch starts. On error nothing is left open.
//
// The feed reads through its own watch stream on client; Close it.
func Open(ctx context.Context, client *clientv3.Client, cfg Config) (*Feed, error) {
	s, err := newScope(cfg)
	if err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	kv := etcdcall.KV(client)
	current, err := s.check(ctx, kv)
	if err != nil {
		return nil, fmt.Errorf("feed of %s: %w", s, err)
	}
	if cfg.Since > current {
		return nil, fmt.Errorf("feed of %s: %w", s, &AheadError{Cursor: cfg.Since, Current: current})
	}
	f := &Feed{scope: s, kv: kv, log: cfg.Logger, cursor: cfg.Since, until: cfg.Until}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	if cfg.UntilOpen {
		f.until = max(current, cfg.Since)
	}
	switch {
	case f.until > current:
		return nil, fmt.Errorf("feed of %s: %w: until %d is ahead of etcd's revision %d", s, ErrInvalidArgument, f.until, current)
	case f.until > f.cursor:
		// The latest revision at which a record in scope that still exists
		// at until was written. When etcd's progress report says every
		// event up to until was sent, the feed also waits for this one: an
		// etcd 3.4 server before 3.4.25 can send that report ahead of the
		// events (etcd#15220).
		resp, err := kv.Get(ctx, s.start, clientv3.WithRange(s.end), clientv3.WithRev(f.until), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend), clientv3.WithLimit(1))
		switch {
		case errors.Is(err, rpctypes.ErrCompacted):
			// Since < until < etcd's compaction: the first Next reports it,
			// with the compact revision the watch is told.
			f.lastPut = f.until
		case err != nil:
			return nil, fmt.Errorf("feed of %s: %w", s, err)
		case len(resp.Kvs) > 0:
			f.lastPut = resp.Kvs[0].ModRevision
		}
	}
	f.w = clientv3.NewWatcher(client)
	f.ctx, f.cancel = context.WithCancel(context.Background())
	return f, nil
}

// Cursor is the revision every event up to which has been delivered: the
// last Batch's Cursor, or Since before the first, or Until after io.EOF.
func (f *Feed) Cursor() int64 { return f.cursor }

// Restarts counts the watches the feed opened again after one broke (a
// member restarted, the leader was lost, the connection dropped). Each
// resumed right after the feed's cursor.
func (f *Feed) Restarts() int64 { return f.restarts.Load() }

// restartBackoff bounds the pause before a watch is opened again after it
// broke: from restartMin, doubling, to restartMax. A healthy cluster that
// moved the watch to another member costs restartMin.
const (
	restartMin = 20 * time.Millisecond
	restartMax = time.Second
)

// progressEvery is how often a feed with an end asks etcd whether it has
// sent everything up to that end, while no event comes.
const progressEvery = 200 * time.Millisecond

// Next waits for the next batch: every event of one or more whole
// revisions after Cursor, never part of a revision. ctx bounds the
// wait only: when it ends Next returns its cause, has delivered nothing,
// and the feed stays usable. A watch that breaks (a member restarts, the
// leader changes, the connection drops) is opened again right after
// Cursor, without a gap or a duplicate.
//
// Errors: io.EOF once a feed with an end has delivered everything up to
// it; *CompactedError when etcd no longer has the events after Cursor;
// *segments.CorruptError for an order record that does not decode (the
// feed does not skip it: a later Next meets it again); ErrClosed after
// Close; etcd's refusal (permissions, for example). After an error other
// than ctx's the next call starts a new watch from Cursor.
func (f *Feed) Next(ctx context.Context) (Batch, error) {
	backoff := restartMin
	for {
		if f.closed.Load() {
			return Batch{}, ErrClosed
		}
		if f.until > 0 && (f.cursor >= f.until || f.reached || f.progressed && f.cursor >= f.lastPut) {
			f.done, f.cursor = true, f.until
			f.stopWatch()
		}
		if f.done {
			return Batch{}, io.EOF
		}
		if f.watch == nil {
			f.watch = f.startWatch()
		}
		before := f.cursor
		b, err := f.watch.next(ctx, f)
		switch {
		case err == nil && f.cursor > before:
			return b, nil
		case err == nil:
			backoff = restartMin // the watch works; nothing to deliver yet
			continue
		case ctx.Err() != nil:
			return Batch{}, context.Cause(ctx)
		case f.closed.Load():
			return Batch{}, ErrClosed
		}
		f.stopWatch()
		if !errors.Is(err, errWatchBroken) {
			return Batch{}, fmt.Errorf("feed of %s after revision %d: %w", f.scope, f.cursor, err)
		}
		f.restarts.Add(1)
		f.log.Debug("feed: watch broke, opening it again", "scope", f.scope.String(), "cursor", f.cursor, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return Batch{}, context.Cause(ctx)
		case <-f.ctx.Done():
			t.Stop()
			return Batch{}, ErrClosed
		}
		backoff = min(2*backoff, restartMax)
	}
}

// Close stops the feed and releases its watch stream. It never fails;
// calling it again does nothing.
func (f *Feed) Close() error {
	if f.closed.Swap(true) {
		return nil
	}
	f.cancel()
	return f.w.Close()
}

func (f *Feed) stopWatch() {
	if f.watch != nil {
		f.watch.stop()
		f.watch = nil
	}
}
