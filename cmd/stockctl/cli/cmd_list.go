package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/segments"
)

func listCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "list",
		Usage:     "list the SKUs under the prefix, with their size and policy",
		ArgsUsage: " ",
		Action:    listAction,
	}
}

// listView is the result of list: every SKU whose creation completed, in
// name order, read at one revision.
//
// With several clusters, Revision is 0 (each cluster has its own:
// Revisions, by cluster), every row names its cluster, and Unreachable
// names the clusters that could not be read.
type listView struct {
	SKUs        []skuRow         `json:"skus"`
	Revision    int64            `json:"revision"`
	Revisions   map[string]int64 `json:"revisions,omitempty"`
	Unreachable []string         `json:"unreachable,omitempty"`
}

// skuRow is one SKU's meta record.
type skuRow struct {
	SKU          string    `json:"sku"`
	Cluster      string    `json:"cluster,omitempty"` // with several clusters: the one that holds it
	Total        int64     `json:"total"`
	Segments     int       `json:"segments"`
	LowWatermark int64     `json:"lowWatermark"`
	RefillBatch  int64     `json:"refillBatch"`
	PerUserLimit int64     `json:"perUserLimit"`
	Created      time.Time `json:"created"`
}

func (v listView) table() table {
	var t table
	several := v.Revisions != nil
	t.header = []string{"SKU", "TOTAL", "SEGMENTS", "LOW WATERMARK", "REFILL BATCH", "PER-USER LIMIT", "CREATED"}
	if several {
		t.header = append(t.header, "CLUSTER")
	}
	for _, r := range v.SKUs {
		limit := "none"
		if r.PerUserLimit > 0 {
			limit = fmt.Sprint(r.PerUserLimit)
		}
		row := []string{r.SKU, fmt.Sprint(r.Total), fmt.Sprint(r.Segments), fmt.Sprint(r.LowWatermark),
			fmt.Sprint(r.RefillBatch), limit, r.Created.UTC().Format(time.DateTime)}
		if several {
			row = append(row, r.Cluster)
		}
		t.rows = append(t.rows, row)
	}
	for _, u := range v.Unreachable {
		t.notes = append(t.notes, fmt.Sprintf("(cluster %s could not be read: its SKUs are missing above)", u))
	}
	if len(v.SKUs) == 0 {
		t.notes = append(t.notes, "(no SKU under this prefix: stockctl init creates one)")
	}
	return t
}

func listAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	if c.NArg() > 0 {
		return usageError("list takes no arguments, got %q", c.Args().Slice())
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		names := clusterNames(cn.coord)
		v := listView{SKUs: []skuRow{}}
		if len(names) > 1 || names[0] != "" {
			v.Revisions = map[string]int64{}
		}
		var unreachable []error
		for _, name := range names {
			cctx, cancel := ctx, context.CancelFunc(func() {})
			if v.Revisions != nil { // a cluster that is down costs --dial-timeout, not the command's
				cctx, cancel = context.WithTimeout(ctx, g.dialTimeout)
			}
			err := listCluster(cctx, clusterCoord(cn.coord, name), name, &v)
			cancel()
			switch {
			case err != nil && v.Revisions == nil:
				return failed(ctx, "list the SKUs", err)
			case err != nil:
				v.Unreachable = append(v.Unreachable, name)
				unreachable = append(unreachable, fmt.Errorf("cluster %s: %w", name, err))
			}
		}
		slices.SortFunc(v.SKUs, func(a, b skuRow) int { return strings.Compare(a.SKU, b.SKU) })
		if err := show(c, g, v); err != nil {
			return err
		}
		if len(unreachable) > 0 {
			return failed(ctx, "list the SKUs of every cluster", errors.Join(unreachable...))
		}
		return nil
	})
}

// listCluster adds the SKUs of one cluster (name "": the only one) to v.
func listCluster(ctx context.Context, coord *coordinator.Coordinator, name string, v *listView) error {
	e := engines.Of(coord)
	resp, err := e.KV.Get(ctx, e.Keys.MetaPrefix(), clientv3.WithPrefix())
	if err != nil {
		return err
	}
	if v.Revisions != nil {
		v.Revisions[name] = resp.Header.Revision
	} else {
		v.Revision = resp.Header.Revision
	}
	for _, kv := range resp.Kvs {
		sku, err := e.Keys.ParseMeta(string(kv.Key))
		if err != nil {
			continue // not a SKU's meta record
		}
		m, err := segments.DecodeMeta(string(kv.Key), kv.Value)
		if err != nil {
			return err
		}
		if m.Creating {
			continue // not a SKU yet: it serves nothing until its creation completes
		}
		v.SKUs = append(v.SKUs, skuRow{SKU: sku, Cluster: name, Total: m.Total, Segments: m.Segments, LowWatermark: m.LowWatermark,
			RefillBatch: m.RefillBatch, PerUserLimit: m.PerUserLimit, Created: m.Created})
	}
	return nil
}
