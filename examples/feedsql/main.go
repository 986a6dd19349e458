package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/feed"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// config is feedsql's flags.
type config struct {
	endpoints []string
	prefix    string
	sku       string
	db        string
	untilNow  bool
}

func parseFlags(args []string, errOut io.Writer) (config, error) {
	fs := flag.NewFlagSet("feedsql", flag.ContinueOnError)
	fs.SetOutput(errOut)
	endpoints := fs.String("endpoints", "127.0.0.1:2379", "etcd endpoints, comma-separated")
	prefix := fs.String("prefix", coordinator.DefaultPrefix, "the coordinators' etcd key prefix")
	sku := fs.String("sku", "", "the SKU whose orders to apply (default: every SKU)")
	db := fs.String("db", "orders.db", "the SQLite database file")
	untilNow := fs.Bool("until-now", false, "apply the events up to etcd's revision at the start, then exit")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return config{endpoints: strings.Split(*endpoints, ","), prefix: *prefix, sku: *sku, db: *db, untilNow: *untilNow}, nil
}

// run applies the feed until ctx ends (exit 0), or with --until-now until
// it has caught up. It returns the exit status.
func run(ctx context.Context, args []string, out, errOut io.Writer) int {
	cfg, err := parseFlags(args, errOut)
	if err != nil {
		fmt.Fprintln(errOut, "feedsql:", err)
		return 2
	}
	client, err := clientv3.New(clientv3.Config{Endpoints: cfg.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		fmt.Fprintln(errOut, "feedsql: connect to etcd:", err)
		return 1
	}
	defer client.Close()
	scope := cfg.prefix + "|" + cfg.sku
	if cfg.sku == "" {
		scope = cfg.prefix + "|*"
	}
	st, err := openStore(ctx, cfg.db, scope)
	if err != nil {
		fmt.Fprintln(errOut, "feedsql:", err)
		return 1
	}
	defer st.Close()
	err = consume(ctx, client, st, feed.Config{Prefix: cfg.prefix, SKU: cfg.sku, UntilOpen: cfg.untilNow}, out)
	switch {
	case err == nil, ctx.Err() != nil:
		return 0
	default:
		fmt.Fprintln(errOut, "feedsql:", err)
		return 1
	}
}

// consume applies the feed from the stored cursor, one transaction per
// batch, starting again from a snapshot when etcd compacted past the
// cursor. It returns nil once a feed with an end has caught up.
func consume(ctx context.Context, client *clientv3.Client, st *store, cfg feed.Config, out io.Writer) error {
	cursor, err := st.cursor(ctx)
	if err != nil {
		return fmt.Errorf("read the cursor: %w", err)
	}
	fmt.Fprintf(out, "start cursor=%d\n", cursor)
	for {
		cfg.Since = cursor
		err := follow(ctx, client, st, cfg, out)
		if !errors.Is(err, feed.ErrCompacted) {
			return err
		}
		// The events after the cursor are gone: take every order as it is
		// now, in one transaction with the snapshot's revision as the
		// cursor, and follow on from there.
		snap, err := feed.Snapshot(ctx, client, cfg)
		if err != nil {
			return err
		}
		if err := st.apply(ctx, snap); err != nil {
			return fmt.Errorf("apply a snapshot at revision %d: %w", snap.Cursor, err)
		}
		fmt.Fprintf(out, "snapshot orders=%d cursor=%d\n", len(snap.Events), snap.Cursor)
		cursor = snap.Cursor
	}
}

// follow applies one feed from cfg.Since until it ends or fails.
func follow(ctx context.Context, client *clientv3.Client, st *store, cfg feed.Config, out io.Writer) error {
	f, err := feed.Open(ctx, client, cfg)
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		b, err := f.Next(ctx)
		if errors.Is(err, io.EOF) {
			// Caught up: store the end as the cursor, so the next run
			// starts there even when no event came.
			if err := st.apply(ctx, feed.Batch{Cursor: f.Cursor()}); err != nil {
				return err
			}
			fmt.Fprintf(out, "done cursor=%d\n", f.Cursor())
			return nil
		}
		if err != nil {
			return err
		}
		if err := st.apply(ctx, b); err != nil {
			return fmt.Errorf("apply the events up to revision %d: %w", b.Cursor, err)
		}
		fmt.Fprintf(out, "applied events=%d cursor=%d\n", len(b.Events), b.Cursor)
	}
}
