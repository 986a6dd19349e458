package feed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stockctl/stockctl/coordinator"
)

// The merged feed of several etcd clusters (coordinator.NewClusters): each
// cluster's feed, as Open gives it, merged as the batches come. Each
// cluster's events stay in their order; events of two clusters have no
// order between them (no transaction spans two clusters). The cursor is a
// revision per cluster: resuming from a delivered batch's cursor delivers
// exactly the events after it, cluster by cluster.

// Cursor is a merged feed's position: for each cluster, the revision up to
// which its events have been delivered (a cluster it does not name: none
// yet). Store its String; ParseCursor reads it back.
type Cursor map[string]int64

// String is the cursor's stored form: "name=rev,name=rev", by name; "" for
// an empty cursor. Treat it as opaque.
func (c Cursor) String() string {
	names := make([]string, 0, len(c))
	for n := range c {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + "=" + strconv.FormatInt(c[n], 10)
	}
	return strings.Join(parts, ",")
}

// sinceRemoved checks since's revision for cluster n, removed from the
// fleet, its order feed ending at removed[n]: since must name it at that
// revision or later, or
// its events after since's revision would be skipped. A cluster not in
// removed is unknown.
func sinceRemoved(since Cursor, n string, removed map[string]int64) error {
	end, ok := removed[n]
	rev, named := since[n]
	switch {
	case !ok && removed == nil:
		return fmt.Errorf("if it was removed from the fleet, give the feed the removed clusters (Config.Removed, from "+
			"coordinator's RemovedClusters) (docs/deploy.md, removing a cluster); cursor's revision for it: %d", rev)
	case !ok:
		return errors.New("it is not a cluster removed from the fleet either")
	case !named:
		return fmt.Errorf("the cursor does not name cluster %q, removed from the fleet, whose order feed ended at its revision %d: its events would be "+
			"skipped. If this consumer has read them (or had none to read), add %s=%d to the cursor; else read them first, with a "+
			"feed of that cluster alone (stockctl --endpoints ITS-ENDPOINTS orders --all --since REV, REV 0 for all its history), "+
			"then add it (docs/deploy.md, removing a cluster)", n, end, n, end)
	case rev < end:
		return fmt.Errorf("it was removed from the fleet, and its revision in the cursor, %d, is below %d, where its order feed ended: its events after %d "+
			"would be skipped. Read them first, with a feed of that cluster alone (stockctl --endpoints ITS-ENDPOINTS orders --all "+
			"--since %d), then set %s=%d in the cursor (docs/deploy.md, removing a cluster)", rev, end, rev, rev, n, end)
	}
	return nil
}

// names are the clusters' names.
func names(clusters []coordinator.Cluster) []string {
	out := make([]string, len(clusters))
	for i, c := range clusters {
		out[i] = c.Name
	}
	return out
}

// ParseCursor reads a cursor's String ("" is the empty cursor: every
// cluster from the start of its history).
func ParseCursor(s string) (Cursor, error) {
	c := Cursor{}
	if s == "" {
		return c, nil
	}
	for _, p := range strings.Split(s, ",") {
		name, rev, ok := strings.Cut(p, "=")
		n, err := strconv.ParseInt(rev, 10, 64)
		if !ok || name == "" || err != nil || n < 0 {
			return nil, fmt.Errorf("%w: cursor %q: want name=revision,... as a merged feed's cursor", ErrInvalidArgument, s)
		}
		if _, dup := c[name]; dup {
			return nil, fmt.Errorf("%w: cursor %q names cluster %q twice", ErrInvalidArgument, s, name)
		}
		c[name] = n
	}
	return c, nil
}

// MergedBatch is one cluster's batch of a merged feed, and the merged
// cursor once it is applied.
type MergedBatch struct {
	Cluster string
	// Batch is the cluster's batch; its Cursor is a revision of that
	// cluster.
	Batch
	// Merged is the merged cursor to store once the batch is applied.
	Merged string
}

// ClusterError is an error of one cluster of a merged feed: errors.Is
// sees through it (ErrCompacted, ErrCursorAhead ...).
type ClusterError struct {
	Cluster string
	Err     error
}

func (e *ClusterError) Error() string { return fmt.Sprintf("cluster %q: %v", e.Cluster, e.Err) }
func (e *ClusterError) Unwrap() error { return e.Err }

// Merged is a merged feed. Next is not safe for concurrent use; Close is.
type Merged struct {
	cursor  Cursor
	results chan mergedResult
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	open    int // clusters whose feed has not ended
}

type mergedResult struct {
	cluster string
	b       Batch
	err     error
}

// reopenWait is how long a merged feed waits before trying again to open
// the feed of a cluster it could not reach.
const reopenWait = time.Second

// OpenMerged starts the merged feed of clusters' orders (every SKU's)
// after since. cfg.SKU must be "" and cfg.Since 0 (since replaces it) and cfg.Until too (UntilOpen
// ends each cluster's feed at the revision that cluster was at when its
// feed opened; the merged feed returns io.EOF once all have ended). A
// cluster named in since but not in clusters is ErrInvalidArgument.
//
// It returns at once: each cluster's feed is opened in the background,
// again and again while the cluster cannot be reached, so that a cluster
// that is down delays only its own events. Close it.
func OpenMerged(clusters []coordinator.Cluster, cfg Config, since Cursor) (*Merged, error) {
	switch {
	case cfg.Since != 0 || cfg.Until != 0:
		return nil, fmt.Errorf("%w: a merged feed takes its cursor as since, and no Until", ErrInvalidArgument)
	case cfg.SKU != "":
		return nil, fmt.Errorf("%w: a SKU's feed is its cluster's: Open it on that cluster (coordinator's ClusterOf)", ErrInvalidArgument)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for _, c := range clusters {
		known[c.Name] = true
		if _, ok := cfg.Removed[c.Name]; ok {
			return nil, fmt.Errorf("%w: cluster %q is given to the feed and also said removed", ErrInvalidArgument, c.Name)
		}
	}
	for n := range since {
		if known[n] {
			continue
		}
		if err := sinceRemoved(since, n, cfg.Removed); err != nil {
			return nil, fmt.Errorf("%w: the cursor names cluster %q, which is not one of the feed's (%s): %w", ErrInvalidArgument,
				n, strings.Join(names(clusters), ","), err)
		}
	}
	if len(since) > 0 {
		for _, n := range slices.Sorted(maps.Keys(cfg.Removed)) {
			if err := sinceRemoved(since, n, cfg.Removed); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
			}
		}
	}
	m := &Merged{cursor: Cursor{}, results: make(chan mergedResult), open: len(clusters)}
	for n, r := range since {
		m.cursor[n] = r
	}
	if len(since) == 0 {
		// A new consumer: it starts after the removed clusters' ends.
		for n, r := range cfg.Removed {
			m.cursor[n] = r
		}
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	for _, c := range clusters {
		ccfg := cfg
		ccfg.Since = since[c.Name]
		m.wg.Go(func() { m.follow(c, ccfg) })
	}
	return m, nil
}

// follow feeds one cluster's batches to Next until its feed ends or the
// merged feed is closed.
func (m *Merged) follow(c coordinator.Cluster, cfg Config) {
	send := func(r mergedResult) bool {
		select {
		case m.results <- r:
			return true
		case <-m.ctx.Done():
			return false
		}
	}
	var f *Feed
	for f == nil {
		octx, cancel := context.WithTimeout(m.ctx, reopenWait)
		var err error
		f, err = Open(octx, c.Client, cfg)
		cancel()
		switch {
		case m.ctx.Err() != nil:
			return
		case err == nil:
		case errors.Is(err, ErrCursorAhead) || errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrUnknownSKU):
			send(mergedResult{cluster: c.Name, err: err})
			return
		default: // not reachable now: try again
			select {
			case <-time.After(reopenWait):
			case <-m.ctx.Done():
				return
			}
		}
	}
	defer f.Close()
	for {
		b, err := f.Next(m.ctx)
		if m.ctx.Err() != nil {
			return
		}
		if err == io.EOF {
			b.Cursor = f.Cursor()
		}
		if !send(mergedResult{cluster: c.Name, b: b, err: err}) {
			return
		}
		if err == io.EOF || errors.Is(err, ErrCompacted) || errors.Is(err, ErrClosed) {
			return
		}
	}
}

// Next returns the next batch of any cluster, with the merged cursor after
// it. Errors: io.EOF once every cluster's feed has ended (UntilOpen); a
// *ClusterError naming the cluster, wrapping its feed's error (a
// *CompactedError: that cluster's history after the cursor is gone, and
// it delivers nothing more; start it again from a snapshot of it and a
// cursor naming the snapshot's revision for it); ctx's error; ErrClosed.
// The other clusters go on: Next may be called again after a cluster's
// error.
func (m *Merged) Next(ctx context.Context) (MergedBatch, error) {
	for {
		if m.open == 0 {
			return MergedBatch{}, io.EOF
		}
		select {
		case <-ctx.Done():
			return MergedBatch{}, context.Cause(ctx)
		case <-m.ctx.Done():
			return MergedBatch{}, ErrClosed
		case r := <-m.results:
			switch {
			case r.err == io.EOF:
				m.open--
				m.cursor[r.cluster] = r.b.Cursor
				continue
			case r.err != nil:
				if errors.Is(r.err, ErrCompacted) || errors.Is(r.err, ErrCursorAhead) || errors.Is(r.err, ErrInvalidArgument) || errors.Is(r.err, ErrUnknownSKU) {
					m.open-- // that cluster's feed has ended
				}
				return MergedBatch{}, &ClusterError{Cluster: r.cluster, Err: r.err}
			}
			m.cursor[r.cluster] = r.b.Cursor
			return MergedBatch{Cluster: r.cluster, Batch: r.b, Merged: m.cursor.String()}, nil
		}
	}
}

// Cursor is the merged cursor after the last batch Next returned.
func (m *Merged) Cursor() string { return m.cursor.String() }

// Close stops every cluster's feed. Batches read ahead and not returned by
// Next are dropped: the cursor never counted them.
func (m *Merged) Close() error {
	m.cancel()
	m.wg.Wait()
	return nil
}
