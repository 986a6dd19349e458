package cli

import (
	"context"
	"fmt"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/coordinator"
)

func removeClusterCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "remove-cluster",
		Usage: "remove a cluster from the fleet, once it holds no SKU and no lock",
		Description: "Run with the fleet's clusters (--cluster ..., as every process has them). The cluster must hold\n" +
			"nothing: a SKU placed in it (drain and delete it, or move it: docs/deploy.md) or a lock held or\n" +
			"waited for in it fails with exit 5, naming them all. The first cluster (the registry) cannot be\n" +
			"removed. A lock cluster (one the fleet was first started with, over which named locks are placed)\n" +
			"is removed only with --move-locks and every process of the fleet stopped: its lock names move to\n" +
			"the other lock clusters. Once removed, processes are started without it (one that names it is\n" +
			"refused) and no SKU can be created in it. It prints the end of the cluster's order feed (its last\n" +
			"order change): a merged feed's cursor at or past it for the cluster has all of its events (orders\n" +
			"--all then carries it; below it, or without the cluster, is refused). With --drain, a\n" +
			"refusal keeps the removal begun: no SKU is created in the cluster from then on (names that hash to\n" +
			"it go to the others) while you delete or move its SKUs; run it again once they are gone (a refusal\n" +
			"without --drain ends the drain).",
		ArgsUsage: "NAME [--drain] [--move-locks]",
		Flags: []ucli.Flag{
			&ucli.BoolFlag{Name: "drain", Usage: "when refused, keep the removal begun: no SKU is created in it from now on"},
			&ucli.BoolFlag{Name: "move-locks", Usage: "remove a lock cluster: its lock names move to the others (every process stopped)"},
		},
		Action: removeClusterAction,
	}
}

// removeClusterView is the result of remove-cluster.
type removeClusterView struct {
	Cluster       string   `json:"cluster"`
	Revision      int64    `json:"revision"`
	FeedEnd       int64    `json:"feedEnd"`
	Clusters      []string `json:"clusters"`
	Locks         []string `json:"locks"`
	LockCluster   bool     `json:"lockCluster"`
	TokensMayDrop []string `json:"tokensMayDrop"`
	Unrewritten   []string `json:"unrewritten"`
}

func (v removeClusterView) table() table {
	var t table
	t.add("REMOVED", fmt.Sprintf("cluster %s, at its revision %d", v.Cluster, v.Revision))
	t.add("FEED END", fmt.Sprintf("%s's last order change is at its revision %d: a merged feed's cursor at or past it for %s has all of its events",
		v.Cluster, v.FeedEnd, v.Cluster))
	t.add("CLUSTERS", strings.Join(v.Clusters, ",")+" (give every process these, in this order)")
	locks := strings.Join(v.Locks, ",")
	if v.LockCluster {
		locks += fmt.Sprintf(" (the lock names placed in %s moved to these)", v.Cluster)
	}
	t.add("LOCKS", locks)
	if len(v.TokensMayDrop) > 0 {
		t.notes = append(t.notes, fmt.Sprintf("fencing tokens of the lock names moved to %s may be lower than %s gave them, until "+
			"their revision passes %d", strings.Join(v.TokensMayDrop, ","), v.Cluster, v.Revision))
	}
	if len(v.Unrewritten) > 0 {
		t.notes = append(t.notes, fmt.Sprintf("the fleet records of %s could not be rewritten: the first process started with the "+
			"new list rewrites them", strings.Join(v.Unrewritten, ",")))
	}
	return t
}

func removeClusterAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	if c.NArg() != 1 {
		return usageError("remove-cluster takes one cluster NAME, got %q (usage: stockctl remove-cluster %s)", c.Args().Slice(), c.Command.ArgsUsage)
	}
	name := c.Args().First()
	if len(g.clusters) == 0 {
		return usageError("remove-cluster needs the fleet's clusters: --cluster NAME=endpoints for each, in the fleet's order")
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		r, err := cn.coord.RemoveCluster(ctx, name, coordinator.RemoveClusterOptions{MoveLocks: c.Bool("move-locks"), Drain: c.Bool("drain")})
		if err != nil {
			return opFailed(ctx, err)
		}
		return show(c, g, removeClusterView{Cluster: r.Cluster, Revision: r.Revision, FeedEnd: r.FeedEnd, Clusters: r.Clusters, Locks: r.Locks,
			LockCluster: r.LockCluster, TokensMayDrop: nonNil(r.TokensMayDrop), Unrewritten: nonNil(r.Unrewritten)})
	})
}

// nonNil is s, or an empty slice for nil (JSON [] rather than null).
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
