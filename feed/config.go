package feed

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/keys"
	"github.com/stockctl/stockctl/segments"
)

// Config says which orders a feed follows and from where.
type Config struct {
	// Prefix is the coordinators' etcd key prefix (coordinator.WithPrefix);
	// "" means coordinator.DefaultPrefix.
	Prefix string
	// SKU is the SKU whose orders the feed follows; "" follows every SKU's.
	SKU string
	// Since is the cursor to resume from: the feed delivers exactly the
	// events whose Revision is greater than Since. 0 starts at the
	// beginning of etcd's history (revision 1). Store a Batch's Cursor and
	// pass it here to resume. Snapshot ignores it.
	Since int64
	// Until, when positive, ends the feed at that revision: once every
	// event up to it has been delivered, Next returns io.EOF and Cursor is
	// Until. It must not be ahead of etcd at Open. 0: the feed follows live
	// changes until Close.
	Until int64
	// UntilOpen ends the feed at the revision etcd is at when Open runs:
	// everything so far, then io.EOF (a catch-up, as a nightly job wants).
	// Not together with Until.
	UntilOpen bool
	// Removed, for OpenMerged only, names the clusters removed from the
	// fleet, each with the end of its order feed, the revision of its
	// last order change (coordinator.RemovedClusters): a cursor must name
	// each at that revision or later (it has every event of it; the feed
	// keeps it in the cursors it gives), or be empty (a new consumer: its
	// cursors get them at those revisions). Otherwise OpenMerged refuses
	// the cursor, which would skip events of a removed cluster. nil: not
	// checked.
	Removed map[string]int64
	// Logger receives a debug record for each watch the feed opens again
	// after one broke, with the reason. Default: discarded.
	Logger *slog.Logger
}

// scope is the etcd key range a feed or snapshot reads, and how to check
// what it finds.
type scope struct {
	space      keys.Space
	sku        string // "" for every SKU
	start, end string // [start, end)
}

// newScope validates cfg's prefix and SKU.
func newScope(cfg Config) (scope, error) {
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = coordinator.DefaultPrefix
	}
	space, err := keys.New(prefix)
	if err != nil {
		return scope{}, fmt.Errorf("feed: %w: prefix: %v", ErrInvalidArgument, err)
	}
	s := scope{space: space, sku: cfg.SKU}
	if cfg.SKU != "" {
		if err := segments.ValidateSKU(cfg.SKU); err != nil {
			return scope{}, fmt.Errorf("feed: %w", err)
		}
		s.start = space.Orders(cfg.SKU)
	} else {
		s.start = ordersRoot(space)
	}
	s.end = clientv3.GetPrefixRangeEnd(s.start)
	return s, nil
}

// ordersRoot is the prefix of every SKU's order records. internal/keys
// builds only one SKU's (Orders(sku) = P orders/<sku>/); the root is that
// key with the SKU and its slash taken off, so the layout stays spelled in
// one place.
func ordersRoot(space keys.Space) string {
	const probe = "x"
	return strings.TrimSuffix(space.Orders(probe), probe+"/")
}

// String names the scope in errors: "iphone", "every SKU".
func (s scope) String() string {
	if s.sku == "" {
		return "every SKU"
	}
	return s.sku
}

// check reads, in one linearizable request, whether the scope's SKU exists
// and etcd's current revision.
func (s scope) check(ctx context.Context, kv clientv3.KV) (int64, error) {
	if s.sku == "" {
		resp, err := kv.Get(ctx, s.space.MetaPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 0, err
		}
		return resp.Header.Revision, nil
	}
	resp, err := kv.Get(ctx, s.space.Meta(s.sku), clientv3.WithKeysOnly())
	if err != nil {
		return 0, err
	}
	if len(resp.Kvs) == 0 {
		return 0, fmt.Errorf("%w %q (no meta record under %s)", ErrUnknownSKU, s.sku, s.space.Prefix())
	}
	return resp.Header.Revision, nil
}

// validate checks the cursor fields of cfg.
func (cfg Config) validate() error {
	switch {
	case cfg.Since < 0:
		return fmt.Errorf("feed: %w: since %d is negative (0 starts at the beginning of etcd's history)", ErrInvalidArgument, cfg.Since)
	case cfg.Until < 0:
		return fmt.Errorf("feed: %w: until %d is negative (0: no end)", ErrInvalidArgument, cfg.Until)
	case cfg.Until > 0 && cfg.UntilOpen:
		return fmt.Errorf("feed: %w: until %d and UntilOpen both set", ErrInvalidArgument, cfg.Until)
	case cfg.Until > 0 && cfg.Until < cfg.Since:
		return fmt.Errorf("feed: %w: until %d is before since %d", ErrInvalidArgument, cfg.Until, cfg.Since)
	}
	return nil
}
