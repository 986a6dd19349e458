package cli

import (
	"context"
	"fmt"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/segments"
)

func statusCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "status",
		Usage: "show a SKU's stock: pool, segments, allocated, and the rebalancer's last pass",
		Description: "With --watch, shows it again on every change (an etcd watch, not polling) until interrupted:\n" +
			"drawn over itself on a terminal (at most every 100ms), else a block of lines per change, or\n" +
			"with -o json one JSON object per line. Adds orders/s, refills/s, the elected rebalancer and\n" +
			"each lock's holder. See docs/watching.md.",
		ArgsUsage: "SKU [--watch]",
		Flags: []ucli.Flag{
			&ucli.BoolFlag{Name: "watch", Aliases: []string{"w"}, Usage: "show the stock again on every change, until interrupted"},
		},
		Action: statusAction,
	}
}

// statusView is the result of status: the SKU's stock at one revision.
type statusView struct {
	SKU          string        `json:"sku"`
	Cluster      string        `json:"cluster,omitempty"` // with several clusters: the one that holds the SKU
	Total        int64         `json:"total"`
	Pool         int64         `json:"pool"`
	Allocated    int64         `json:"allocated"`
	Reserved     int64         `json:"reserved"`
	Reservations int64         `json:"reservations"`
	PerUserLimit int64         `json:"perUserLimit"`
	Orders       int64         `json:"orders"`
	Revision     int64         `json:"revision"`
	LowWatermark int64         `json:"lowWatermark"`
	RefillBatch  int64         `json:"refillBatch"`
	Segments     []segmentView `json:"segments"`
	// Leader is the rebalancer elected now ("" when none is); Rebalancer
	// is the last pass, made by its own leader, perhaps gone since.
	Leader     string          `json:"leader"`
	Rebalancer *rebalancerView `json:"rebalancer"`
	// Archived is the part of Allocated held by pruned orders, and
	// ArchivedOrders how many were pruned (stockctl prune).
	Archived       int64 `json:"archived"`
	ArchivedOrders int64 `json:"archivedOrders"`
	// Etcd is each endpoint's database size, quota and alarms.
	Etcd []etcdSpace `json:"etcd"`
}

// segmentView is one segment's stock. Remaining counts the inbox: stock
// the rebalancer moved in that the segment has not absorbed yet.
type segmentView struct {
	Index     int   `json:"index"`
	Remaining int64 `json:"remaining"`
	Inbox     int64 `json:"inbox"`
}

// rebalancerView is the rebalancer's last pass (under the prefix, for all
// SKUs), and its totals since its leader was elected.
type rebalancerView struct {
	Leader     string    `json:"leader"`
	At         time.Time `json:"at"`
	Moves      int       `json:"moves"`
	Moved      int64     `json:"moved"`
	Revision   int64     `json:"revision"`
	TotalMoves int       `json:"totalMoves"`
	TotalMoved int64     `json:"totalMoved"`
}

func statusViewOf(st *coordinator.Status) statusView {
	v := statusView{SKU: st.SKU, Total: st.Total, Pool: st.Pool, Allocated: st.Allocated, Orders: st.Orders,
		Reserved: st.Reserved, Reservations: st.Reservations, PerUserLimit: st.Meta.PerUserLimit,
		Revision: st.Revision, LowWatermark: st.Meta.LowWatermark, RefillBatch: st.Meta.RefillBatch,
		Segments: make([]segmentView, len(st.Segments)), Archived: st.Archived, ArchivedOrders: st.ArchivedOrders, Etcd: []etcdSpace{}}
	for i, s := range st.Segments {
		v.Segments[i] = segmentView{Index: s.Index, Remaining: s.Remaining, Inbox: s.Inbox}
	}
	if p := st.Rebalancer; p != nil {
		v.Rebalancer = &rebalancerView{Leader: p.Leader, At: p.At, Moves: p.Moves, Moved: p.Moved,
			Revision: p.Revision, TotalMoves: p.TotalMoves, TotalMoved: p.TotalMoved}
	}
	return v
}

func (v statusView) table() table {
	var t table
	t.add("SKU", v.SKU)
	if v.Cluster != "" {
		t.add("CLUSTER", v.Cluster)
	}
	t.add("TOTAL", v.Total)
	t.add("POOL", v.Pool)
	t.add("ALLOCATED", allocatedText(v.Allocated, v.Orders, v.ArchivedOrders))
	t.add("RESERVED", fmt.Sprintf("%d in %d live reservations (%d confirmed or allocated)", v.Reserved, v.Reservations, v.Allocated-v.Reserved))
	if v.ArchivedOrders > 0 {
		t.add("ARCHIVED", fmt.Sprintf("%d of the allocated units, in %d pruned orders", v.Archived, v.ArchivedOrders))
	}
	if v.PerUserLimit > 0 {
		t.add("PER-USER LIMIT", v.PerUserLimit)
	}
	t.add("POLICY", fmt.Sprintf("refill %d when a segment holds less than %d", v.RefillBatch, v.LowWatermark))
	t.add("REVISION", v.Revision)
	leader := v.Leader
	if leader == "" {
		leader = "none elected now"
	}
	t.add("LEADER", leader)
	if r := v.Rebalancer; r != nil {
		t.add("REBALANCER", fmt.Sprintf("last pass by %s at %s: %d moves (%d units); %d moves (%d units) since it was elected",
			r.Leader, r.At.Local().Format(time.DateTime), r.Moves, r.Moved, r.TotalMoves, r.TotalMoved))
	} else {
		t.add("REBALANCER", "never ran")
	}
	for _, s := range v.Etcd {
		if w := s.warning(); w != "" {
			t.add("ETCD", w)
		}
	}
	t.header = []string{"SEGMENT", "REMAINING", "INBOX", "LEVEL"}
	var full int64
	for _, s := range v.Segments {
		full = max(full, s.Remaining)
	}
	t.rows = append(t.rows, []string{"pool", fmt.Sprint(v.Pool), "", bar(v.Pool, full)})
	for _, s := range v.Segments {
		level := bar(s.Remaining, full)
		if s.Remaining < max(v.LowWatermark, 1) {
			level += " low"
		}
		t.rows = append(t.rows, []string{fmt.Sprint(s.Index), fmt.Sprint(s.Remaining), fmt.Sprint(s.Inbox), level})
	}
	if full > 0 {
		t.notes = append(t.notes, fmt.Sprintf("(bars: a full bar is %d units, the largest segment; ▸ means more)", full))
	}
	return t
}

func statusAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	sku, err := oneArg(c, "SKU", segments.ValidateSKU)
	if err != nil {
		return err
	}
	if c.Bool("watch") {
		return watchStatus(c, g, sku)
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		st, err := cn.coord.Status(ctx, sku)
		if err != nil {
			return opFailed(ctx, err)
		}
		v := statusViewOf(st)
		v.Cluster, _ = cn.coord.ClusterOf(ctx, sku)
		in := clusterCoord(cn.coord, v.Cluster) // its cluster's rebalancer and etcd
		v.Leader = currentLeader(cn, in)
		if v.Cluster == "" {
			v.Etcd = readSpace(ctx, cn.client, cn.endpoints)
		} else {
			v.Etcd = readSpace(ctx, in.Client(), in.Client().Endpoints())
		}
		return show(c, g, v)
	})
}

// allocatedText says what ALLOCATED counts: units held by orders, live
// reservations included, and how many order records there are (released
// and expired ones included: a record stays until it is pruned).
func allocatedText(allocated, records, pruned int64) string {
	s := fmt.Sprintf("%d units held by orders and live reservations; %d order records (released and expired included)", allocated, records)
	if pruned > 0 {
		s += fmt.Sprintf(", %d pruned", pruned)
	}
	return s
}
