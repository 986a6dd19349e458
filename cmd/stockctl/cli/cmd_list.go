package cli

import (
	"context"
	"fmt"
	"time"

	ucli "github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

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
type listView struct {
	SKUs     []skuRow `json:"skus"`
	Revision int64    `json:"revision"`
}

// skuRow is one SKU's meta record.
type skuRow struct {
	SKU          string    `json:"sku"`
	Total        int64     `json:"total"`
	Segments     int       `json:"segments"`
	LowWatermark int64     `json:"lowWatermark"`
	RefillBatch  int64     `json:"refillBatch"`
	PerUserLimit int64     `json:"perUserLimit"`
	Created      time.Time `json:"created"`
}

func (v listView) table() table {
	var t table
	t.header = []string{"SKU", "TOTAL", "SEGMENTS", "LOW WATERMARK", "REFILL BATCH", "PER-USER LIMIT", "CREATED"}
	for _, r := range v.SKUs {
		limit := "none"
		if r.PerUserLimit > 0 {
			limit = fmt.Sprint(r.PerUserLimit)
		}
		t.rows = append(t.rows, []string{r.SKU, fmt.Sprint(r.Total), fmt.Sprint(r.Segments), fmt.Sprint(r.LowWatermark),
			fmt.Sprint(r.RefillBatch), limit, r.Created.UTC().Format(time.DateTime)})
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
		e := engines.Of(cn.coord)
		resp, err := e.KV.Get(ctx, e.Keys.MetaPrefix(), clientv3.WithPrefix())
		if err != nil {
			return failed(ctx, "list the SKUs", err)
		}
		v := listView{SKUs: []skuRow{}, Revision: resp.Header.Revision}
		for _, kv := range resp.Kvs {
			sku, err := e.Keys.ParseMeta(string(kv.Key))
			if err != nil {
				continue // not a SKU's meta record
			}
			m, err := segments.DecodeMeta(string(kv.Key), kv.Value)
			if err != nil {
				return failed(ctx, "list the SKUs", err)
			}
			if m.Creating {
				continue // not a SKU yet: it serves nothing until its creation completes
			}
			v.SKUs = append(v.SKUs, skuRow{SKU: sku, Total: m.Total, Segments: m.Segments, LowWatermark: m.LowWatermark,
				RefillBatch: m.RefillBatch, PerUserLimit: m.PerUserLimit, Created: m.Created})
		}
		return show(c, g, v)
	})
}
