package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/feed"
	"github.com/stockctl/stockctl/segments"
)

// ExitCompacted: orders --since names a revision older than etcd's
// compacted history: the events after it are gone. Start again with
// --snapshot.
const ExitCompacted = 8

func ordersCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "orders",
		Usage: "print every change to a SKU's orders, in etcd's order, from a revision (the order feed)",
		Description: "One line per event: allocated, reserved, confirmed, cancelled, released or expired, with the\n" +
			"revision that made it. Without --follow, prints the events up to the revision etcd is at when it\n" +
			"starts, and says on stderr which --since resumes after them. --snapshot prints every order in its\n" +
			"current state first: the way to start again when --since is older than etcd's compaction (exit 8).\n" +
			"With -o json, one JSON object per line, whose cursor is the --since to resume from after it.\n" +
			"See docs/feed.md.",
		ArgsUsage: "SKU|--all [--since REV | --snapshot] [--follow]",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "since", Value: "0", Usage: "print the events after this revision (0: from the start of etcd's history)"},
			&ucli.BoolFlag{Name: "snapshot", Usage: "start with every order in its current state, then the events after it"},
			&ucli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing events as they happen, until interrupted (exit 0)"},
			&ucli.BoolFlag{Name: "all", Usage: "every SKU's orders (instead of a SKU argument)"},
		},
		Action: ordersAction,
	}
}

// ordersArgs are orders' validated arguments.
type ordersArgs struct {
	sku      string // "" with --all
	since    int64
	merged   feed.Cursor // --since as a merged feed's cursor (several clusters, --all)
	snapshot bool
	follow   bool
}

func readOrdersArgs(c *ucli.Context) (ordersArgs, error) {
	a := ordersArgs{snapshot: c.Bool("snapshot"), follow: c.Bool("follow")}
	if c.Bool("all") {
		if c.NArg() > 0 {
			return a, usageError("--all takes no SKU argument, got %q (usage: stockctl orders %s)", c.Args().Slice(), c.Command.ArgsUsage)
		}
	} else {
		sku, err := oneArg(c, "SKU", segments.ValidateSKU)
		if err != nil {
			return a, err
		}
		a.sku = sku
	}
	raw := strings.TrimSpace(c.String("since"))
	since, err := strconv.ParseInt(raw, 10, 64)
	if err != nil && strings.Contains(raw, "=") {
		// A merged feed's cursor (orders --all over several clusters).
		if a.merged, err = feed.ParseCursor(raw); err != nil {
			return a, usageError("invalid --since %q: %v", raw, err)
		}
		since = 0
	}
	if err != nil || since < 0 {
		return a, usageError("invalid --since %q: want a revision, a whole number from 0 (0: from the start of etcd's history)", c.String("since"))
	}
	a.since = since
	if a.snapshot && c.IsSet("since") {
		return a, usageError("--snapshot and --since exclude each other: a snapshot starts from the current orders")
	}
	return a, nil
}

// orderEventView is one line of orders -o json.
type orderEventView struct {
	Revision    int64      `json:"revision"`
	Event       string     `json:"event"`
	SKU         string     `json:"sku"`
	Order       string     `json:"order"`
	Qty         int64      `json:"qty"`
	Parts       []partView `json:"parts"`
	Buyer       string     `json:"buyer,omitempty"`
	Reservation bool       `json:"reservation"`
	Deadline    *time.Time `json:"deadline,omitempty"`
	Created     time.Time  `json:"created"`
	// Lines: the SKUs of an order of several SKUs (allocate --line), one
	// event per line, every line of a change at one revision.
	Lines []string `json:"lines,omitempty"`
	// Snapshot: the line is an order in its state at the snapshot's
	// revision (--snapshot), not a change.
	Snapshot bool `json:"snapshot"`
	// Cursor is the --since to resume from after this line: every event
	// up to it has been printed. It is the line's revision on the last line
	// of a revision, the one before on the others, and 0 inside a
	// snapshot (only its last line has the snapshot's revision).
	Cursor int64 `json:"cursor"`
	// Cluster and MergedCursor are set by orders --all over several
	// clusters: the cluster of the event (Cursor is a revision of that
	// cluster), and the --since to resume the merged feed after this line.
	Cluster      string `json:"cluster,omitempty"`
	MergedCursor string `json:"mergedCursor,omitempty"`
}

// orderEventViews builds the lines of a batch. Within a batch, a revision
// ends where the next event's revision is greater.
func orderEventViews(b feed.Batch, prevCursor int64, snapshot bool) []orderEventView {
	out := make([]orderEventView, len(b.Events))
	cursor := prevCursor
	for i, e := range b.Events {
		v := orderEventView{Revision: e.Revision, Event: string(e.Kind), SKU: e.SKU, Order: e.Order, Qty: e.Qty,
			Parts: partViews(e.Parts), Buyer: e.Buyer, Reservation: e.Reservation, Created: e.Created.UTC(), Lines: e.Lines, Snapshot: snapshot}
		if !e.Deadline.IsZero() {
			d := e.Deadline.UTC()
			v.Deadline = &d
		}
		switch {
		case i == len(b.Events)-1:
			cursor = b.Cursor
		case !snapshot && b.Events[i+1].Revision > e.Revision:
			cursor = e.Revision
		}
		v.Cursor = cursor
		out[i] = v
	}
	return out
}

// text is the line of an event in table output.
func (v orderEventView) text() string {
	var b strings.Builder
	if v.Cluster != "" {
		fmt.Fprintf(&b, "%s  ", v.Cluster)
	}
	fmt.Fprintf(&b, "%8d  %-9s  %s  %s  qty %d  %s", v.Revision, v.Event, v.SKU, v.Order, v.Qty, partsText(v.Parts))
	if v.Buyer != "" {
		fmt.Fprintf(&b, "  buyer %s", v.Buyer)
	}
	if v.Deadline != nil {
		fmt.Fprintf(&b, "  deadline %s", v.Deadline.Format(time.RFC3339))
	}
	if len(v.Lines) > 0 {
		fmt.Fprintf(&b, "  lines %s", strings.Join(v.Lines, ","))
	}
	return b.String()
}

// ordersPrinter writes orders' lines: one per event, and in table output
// notes (lines starting with "#") around a snapshot.
type ordersPrinter struct {
	w      io.Writer
	json   bool
	cursor int64
}

func (p *ordersPrinter) note(format string, args ...any) error {
	if p.json {
		return nil
	}
	_, err := fmt.Fprintf(p.w, "# "+format+"\n", args...)
	return err
}

func (p *ordersPrinter) print(b feed.Batch, snapshot bool) error {
	return p.printViews(orderEventViews(b, p.cursor, snapshot), b.Cursor)
}

// printMerged prints a batch of a merged feed: each line names its
// cluster and the merged cursor after it; merged is the cursor before.
func (p *ordersPrinter) printMerged(b feed.MergedBatch, merged feed.Cursor) error {
	views := orderEventViews(b.Batch, merged[b.Cluster], false)
	for i := range views {
		views[i].Cluster = b.Cluster
		merged[b.Cluster] = views[i].Cursor
		views[i].MergedCursor = merged.String()
	}
	merged[b.Cluster] = b.Cursor
	return p.printViews(views, 0)
}

func (p *ordersPrinter) printViews(views []orderEventView, cursor int64) error {
	var buf []byte
	for _, v := range views {
		if p.json {
			line, err := json.Marshal(v)
			if err != nil {
				return err
			}
			buf = append(append(buf, line...), '\n')
		} else {
			buf = append(append(buf, v.text()...), '\n')
		}
	}
	p.cursor = cursor
	// One write per batch: a reader never sees part of a revision unless
	// stockctl dies in the middle of the write.
	_, err := p.w.Write(buf)
	return err
}

func ordersAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	a, err := readOrdersArgs(c)
	if err != nil {
		return err
	}
	what := "orders of every SKU"
	if a.sku != "" {
		what = "orders of " + a.sku
	}
	// --timeout bounds the whole command, or only its setup with --follow,
	// which runs until interrupted (as status --watch).
	var ctx, sctx context.Context
	if a.follow {
		var stop, cancel context.CancelFunc
		ctx, stop = signalContext(c)
		defer stop()
		sctx, cancel = g.boundedContext(ctx)
		defer cancel()
	} else {
		var cancel context.CancelFunc
		ctx, cancel = g.commandContext(c)
		defer cancel()
		sctx = ctx
	}
	cn, err := connect(sctx, c, g)
	if err != nil {
		return followEnd(ctx, a, err)
	}
	defer cn.Close()
	if a.follow && cn.server != nil {
		fmt.Fprintf(c.App.ErrWriter, "stockctl: orders --follow: following the embedded etcd in %s: no other process can change it "+
			"while this runs (run `stockctl serve`, and follow with --endpoints)\n", g.dataDir)
	}
	client := cn.client
	switch {
	case a.merged != nil && (cn.coord.Clusters() == nil || a.sku != ""):
		return usageError("invalid --since %q: a merged feed's cursor is for orders --all over several clusters; here --since takes a revision", c.String("since"))
	case cn.coord.Clusters() != nil && a.sku == "":
		return followEnd(ctx, a, ordersMerged(ctx, c, g, cn, a))
	case cn.coord.Clusters() != nil:
		// Several clusters: a SKU's feed is its cluster's, its revisions
		// that cluster's.
		where, err := cn.coord.ClusterOf(sctx, a.sku)
		if err != nil {
			return followEnd(ctx, a, ordersFailed(sctx, "find the cluster of "+a.sku, err))
		}
		client = cn.coord.Cluster(where).Client()
	}
	p := &ordersPrinter{w: c.App.Writer, json: g.output == outputJSON, cursor: a.since}
	cfg := feed.Config{Prefix: g.prefix, SKU: a.sku, Since: a.since, UntilOpen: !a.follow}
	if a.snapshot {
		snap, err := feed.Snapshot(sctx, client, cfg)
		if err != nil {
			return followEnd(ctx, a, ordersFailed(sctx, "read a snapshot of the "+what, err))
		}
		if err := p.note("snapshot at revision %d: %d orders, each in its current state", snap.Cursor, len(snap.Events)); err != nil {
			return writeFailed(err)
		}
		if err := p.print(snap, true); err != nil {
			return writeFailed(err)
		}
		cfg.Since = snap.Cursor
		if err := p.note("events after revision %d", snap.Cursor); err != nil {
			return writeFailed(err)
		}
	}
	f, err := feed.Open(sctx, client, cfg)
	if err != nil {
		return followEnd(ctx, a, ordersFailed(sctx, "read the "+what, err))
	}
	defer f.Close()
	for {
		b, err := f.Next(ctx)
		if errors.Is(err, io.EOF) {
			fmt.Fprintf(c.App.ErrWriter, "stockctl: orders: every event up to revision %d printed; resume with --since %d\n", f.Cursor(), f.Cursor())
			return nil
		}
		if err != nil {
			return followEnd(ctx, a, ordersFailed(ctx, "read the "+what, err))
		}
		if err := p.print(b, false); err != nil {
			return writeFailed(err)
		}
	}
}

// ordersFailed is failed, with the feed's own exit codes: a cursor older
// than etcd's compaction (ExitCompacted) and one ahead of etcd (invalid
// input), each with what to do.
func ordersFailed(ctx context.Context, what string, err error) error {
	switch {
	case errors.Is(err, feed.ErrCompacted):
		return ucli.Exit(fmt.Errorf("failed to %s: %w; print the current orders with --snapshot instead", what, err), ExitCompacted)
	case errors.Is(err, feed.ErrCursorAhead):
		return ucli.Exit(fmt.Errorf("failed to %s: invalid --since: %w", what, err), ExitUsage)
	}
	return failed(ctx, what, err)
}

// followEnd makes an interrupt (or the caller's cancel) the normal end of
// orders --follow, whenever it comes: its ctx has no timeout.
func followEnd(ctx context.Context, a ordersArgs, err error) error {
	if a.follow && ctx.Err() != nil {
		return nil
	}
	return err
}

func writeFailed(err error) error {
	return ucli.Exit(fmt.Errorf("failed to write the output: %w", err), ExitFailure)
}

// ordersMerged is orders --all over several clusters: the merged feed of
// every cluster, each line naming its cluster, resumed with --since and
// the merged cursor it prints.
func ordersMerged(ctx context.Context, c *ucli.Context, g *globals, cn *conn, a ordersArgs) error {
	switch {
	case a.snapshot && a.merged != nil:
		return usageError("--snapshot and --since exclude each other: a snapshot starts from the current orders")
	case a.since > 0:
		return usageError("invalid --since %d: over several clusters, orders --all resumes from the merged cursor it printed (name=rev,...)", a.since)
	}
	var clusters []coordinator.Cluster
	for _, name := range cn.coord.Clusters() {
		clusters = append(clusters, coordinator.Cluster{Name: name, Client: cn.coord.Cluster(name).Client()})
	}
	removed, err := cn.coord.RemovedClusters(ctx)
	if err != nil {
		return ordersFailed(ctx, "read the clusters removed from the fleet", err)
	}
	p := &ordersPrinter{w: c.App.Writer, json: g.output == outputJSON}
	merged := feed.Cursor{}
	for n, r := range a.merged {
		merged[n] = r
	}
	if len(merged) == 0 {
		// A new consumer (from the start, or a snapshot): after the removed
		// clusters' ends, which the cursors it prints carry.
		for n, r := range removed {
			merged[n] = r
		}
	}
	if a.snapshot {
		// Each cluster's snapshot at a revision of its own; the merged
		// feed then goes on from those revisions.
		for _, cl := range clusters {
			snap, err := feed.Snapshot(ctx, cl.Client, feed.Config{Prefix: g.prefix})
			if err != nil {
				return ordersFailed(ctx, "read a snapshot of the orders of cluster "+cl.Name, err)
			}
			if err := p.note("cluster %s: snapshot at revision %d: %d orders, each in its current state", cl.Name, snap.Cursor, len(snap.Events)); err != nil {
				return writeFailed(err)
			}
			views := orderEventViews(snap, 0, true)
			merged[cl.Name] = snap.Cursor
			for i := range views {
				views[i].Cluster = cl.Name
				if i == len(views)-1 {
					views[i].MergedCursor = merged.String() // the snapshot is whole with its last line
				}
			}
			if err := p.printViews(views, 0); err != nil {
				return writeFailed(err)
			}
		}
		if err := p.note("events after %s", merged.String()); err != nil {
			return writeFailed(err)
		}
	}
	m, err := feed.OpenMerged(clusters, feed.Config{Prefix: g.prefix, UntilOpen: !a.follow, Removed: removed}, merged)
	if err != nil {
		return ordersFailed(ctx, "read the orders of every cluster", err)
	}
	defer m.Close()
	for {
		b, err := m.Next(ctx)
		if errors.Is(err, io.EOF) {
			fmt.Fprintf(c.App.ErrWriter, "stockctl: orders: every event printed, of every cluster; resume with --since %s\n", m.Cursor())
			return nil
		}
		if err != nil {
			return ordersFailed(ctx, "read the orders of every cluster", err)
		}
		if err := p.printMerged(b, merged); err != nil {
			return writeFailed(err)
		}
	}
}
