package cli

import (
	"context"
	"fmt"
	"strconv"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/coordinator"
)

func locksCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "locks",
		Usage: "list the holders and waiters of named locks and semaphores",
		Description: "Reads every named lock's and semaphore's etcd keys at one revision: one row per key, in\n" +
			"line order. A key is one process's: its goroutines that share it, or queue behind it, do not\n" +
			"show. Locks and semaphores that nobody holds or waits for do not show either.",
		Action: locksAction,
	}
}

// locksView is the result of locks.
type locksView struct {
	Revision int64          `json:"revision"`
	Locks    []lockStateRow `json:"locks"`
}

type lockStateRow struct {
	Cluster string       `json:"cluster,omitempty"` // with several clusters: the one the lock lives in
	Name    string       `json:"name"`
	Type    string       `json:"type"`  // "lock" or "semaphore"
	Limit   int          `json:"limit"` // 0 for locks
	Holders []lockKeyRow `json:"holders"`
	Waiters []lockKeyRow `json:"waiters"`
}

type lockKeyRow struct {
	Kind     string `json:"kind"` // "exclusive", "shared" or "semaphore"
	Lease    string `json:"lease"`
	Revision int64  `json:"revision"`
	Key      string `json:"key"`
}

func locksViewOf(ls []coordinator.LockState, rev int64) locksView {
	v := locksView{Revision: rev, Locks: []lockStateRow{}}
	for _, l := range ls {
		r := lockStateRow{Cluster: l.Cluster, Name: l.Name, Type: "lock", Limit: l.Limit, Holders: keyRows(l.Holders), Waiters: keyRows(l.Waiters)}
		if l.Semaphore {
			r.Type = "semaphore"
		}
		v.Locks = append(v.Locks, r)
	}
	return v
}

func keyRows(ks []coordinator.LockKeyState) []lockKeyRow {
	out := []lockKeyRow{}
	for _, k := range ks {
		out = append(out, lockKeyRow{Kind: k.Kind.String(), Lease: strconv.FormatInt(k.Lease, 16), Revision: k.Revision, Key: k.Key})
	}
	return out
}

func (v locksView) table() table {
	var t table
	several := v.Revision == 0 && len(v.Locks) > 0 && v.Locks[0].Cluster != ""
	if several {
		t.add("REVISION", "one per cluster")
		t.header = []string{"CLUSTER", "NAME", "TYPE", "STATE", "KIND", "LEASE", "REVISION", "KEY"}
	} else {
		t.add("REVISION", v.Revision)
		t.header = []string{"NAME", "TYPE", "STATE", "KIND", "LEASE", "REVISION", "KEY"}
	}
	row := func(l lockStateRow, cells ...string) {
		if several {
			cells = append([]string{l.Cluster}, cells...)
		}
		t.rows = append(t.rows, cells)
	}
	for _, l := range v.Locks {
		typ := l.Type
		if l.Type == "semaphore" {
			typ = fmt.Sprintf("semaphore/%d", l.Limit)
		}
		for _, k := range l.Holders {
			row(l, l.Name, typ, "holds", k.Kind, k.Lease, strconv.FormatInt(k.Revision, 10), k.Key)
		}
		for i, k := range l.Waiters {
			row(l, l.Name, typ, fmt.Sprintf("waits (%d)", i+1), k.Kind, k.Lease, strconv.FormatInt(k.Revision, 10), k.Key)
		}
	}
	if len(v.Locks) == 0 {
		t.header = nil
		t.notes = append(t.notes, "no lock or semaphore is held or awaited")
	}
	return t
}

func locksAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	if c.Args().Len() > 0 {
		return usageError("locks takes no arguments, got %q", c.Args().Slice())
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		ls, rev, err := cn.coord.Locks(ctx)
		if err != nil {
			return failed(ctx, "list locks", err)
		}
		return show(c, g, locksViewOf(ls, rev))
	})
}
