package feed

import (
	"errors"
	"fmt"

	"github.com/stockctl/stockctl/coordinator"
)

var (
	// ErrCompacted: the events after the cursor are gone, because etcd
	// compacted its history past the cursor. Nothing was delivered. The
	// error is a *CompactedError; start again from a snapshot (Snapshot,
	// then a feed Since its Revision).
	ErrCompacted = errors.New("feed: cursor is older than etcd's compacted history")
	// ErrCursorAhead: the cursor is past etcd's current revision, so it was
	// not made by this etcd (another cluster, or one restored from an older
	// backup). Waiting would skip every event up to it, so the feed refuses
	// instead. The error is an *AheadError.
	ErrCursorAhead = errors.New("feed: cursor is ahead of etcd's current revision")
	// ErrUnknownSKU: the feed names a SKU that was never created.
	ErrUnknownSKU = coordinator.ErrUnknownSKU
	// ErrInvalidArgument: a Config field is out of range. The error's text
	// names it.
	ErrInvalidArgument = coordinator.ErrInvalidArgument
	// ErrClosed: Next or Snapshot was called after Close.
	ErrClosed = errors.New("feed: closed")
)

// CompactedError is the error of a feed whose cursor etcd no longer has
// the history after.
type CompactedError struct {
	// Cursor is the feed's cursor: every event up to it had been delivered.
	Cursor int64
	// CompactRevision is the oldest revision etcd still has history from:
	// a feed can resume from CompactRevision-1 or later.
	CompactRevision int64
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("%v: the events after revision %d are gone (etcd keeps history from revision %d on); "+
		"start again from a snapshot of the orders", ErrCompacted, e.Cursor, e.CompactRevision)
}

// Is makes errors.Is(err, ErrCompacted) true.
func (e *CompactedError) Is(target error) bool { return target == ErrCompacted }

// AheadError is the error of a cursor past etcd's current revision.
type AheadError struct {
	Cursor  int64
	Current int64
}

func (e *AheadError) Error() string {
	return fmt.Sprintf("%v: cursor %d, etcd is at revision %d: the cursor comes from another etcd "+
		"(or one restored from an older backup); start again from a snapshot of the orders", ErrCursorAhead, e.Cursor, e.Current)
}

// Is makes errors.Is(err, ErrCursorAhead) true.
func (e *AheadError) Is(target error) bool { return target == ErrCursorAhead }
