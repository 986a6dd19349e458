package cli

import (
	"context"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/segments"
)

func initCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "init",
		Usage:     "create a SKU with its stock split into segments and a central pool",
		ArgsUsage: "SKU --total N --segments K [--initial-fill F] [--low-watermark W] [--refill-batch B] [--per-user-limit N]",
		Flags: []ucli.Flag{
			&ucli.Int64Flag{Name: "total", Usage: "units of stock (required)"},
			&ucli.IntFlag{Name: "segments", Usage: "number of segments, 1 to 1024 (required)"},
			&ucli.Int64Flag{Name: "initial-fill", Usage: "units that start in the segments, spread evenly; the rest starts in the pool (default: the total)"},
			&ucli.Int64Flag{Name: "low-watermark", Usage: "the rebalancer refills a segment holding less than this"},
			&ucli.Int64Flag{Name: "refill-batch", Usage: "units the rebalancer moves into a segment at once (0: total/(4×segments))"},
			&ucli.StringFlag{Name: "cluster", Usage: "with several clusters (global --cluster): the cluster to create the SKU in (default: the one its name hashes to)"},
			&ucli.Int64Flag{Name: "per-user-limit", Usage: "most units one buyer may hold (confirmed and reserved); orders must then name --buyer (0: no limit)"},
		},
		Action: initAction,
	}
}

// skuView is a SKU's meta record, the result of init.
type skuView struct {
	SKU          string    `json:"sku"`
	Cluster      string    `json:"cluster,omitempty"` // with several clusters: the one it was created in
	Total        int64     `json:"total"`
	Segments     int       `json:"segments"`
	InitialFill  int64     `json:"initialFill"`
	LowWatermark int64     `json:"lowWatermark"`
	RefillBatch  int64     `json:"refillBatch"`
	PerUserLimit int64     `json:"perUserLimit"`
	Created      time.Time `json:"created"`
}

func (v skuView) table() table {
	var t table
	t.add("SKU", v.SKU)
	if v.Cluster != "" {
		t.add("CLUSTER", v.Cluster)
	}
	t.add("TOTAL", v.Total)
	t.add("SEGMENTS", v.Segments)
	t.add("INITIAL FILL", v.InitialFill)
	t.add("POOL", v.Total-v.InitialFill)
	t.add("LOW WATERMARK", v.LowWatermark)
	t.add("REFILL BATCH", v.RefillBatch)
	if v.PerUserLimit > 0 {
		t.add("PER-USER LIMIT", v.PerUserLimit)
	}
	return t
}

func initAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	sku, err := oneArg(c, "SKU", segments.ValidateSKU)
	if err != nil {
		return err
	}
	if err := requireFlags(c, "total", "segments"); err != nil {
		return err
	}
	cfg := coordinator.SKUConfig{
		Total:        c.Int64("total"),
		Segments:     c.Int("segments"),
		InitialFill:  c.Int64("total"),
		LowWatermark: c.Int64("low-watermark"),
		RefillBatch:  c.Int64("refill-batch"),
		PerUserLimit: c.Int64("per-user-limit"),
	}
	if c.IsSet("initial-fill") {
		cfg.InitialFill = c.Int64("initial-fill")
	}
	if err := validateSKUConfig(cfg); err != nil {
		return err
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		meta, err := cn.coord.CreateSKUIn(ctx, c.String("cluster"), sku, cfg)
		if err != nil {
			return opFailed(ctx, err)
		}
		where, _ := cn.coord.ClusterOf(ctx, sku)
		return show(c, g, skuView{SKU: sku, Cluster: where, Total: meta.Total, Segments: meta.Segments, InitialFill: meta.InitialFill,
			LowWatermark: meta.LowWatermark, RefillBatch: meta.RefillBatch, PerUserLimit: meta.PerUserLimit, Created: meta.Created})
	})
}

// validateSKUConfig checks a SKU config before anything is started, with
// the flag names in the messages.
func validateSKUConfig(cfg coordinator.SKUConfig) error {
	switch {
	case cfg.Total < 0 || cfg.Total > segments.MaxTotal:
		return usageError("invalid --total %d: must be between 0 and %d", cfg.Total, segments.MaxTotal)
	case cfg.Segments < 1 || cfg.Segments > segments.MaxSegments:
		return usageError("invalid --segments %d: must be between 1 and %d", cfg.Segments, segments.MaxSegments)
	case cfg.InitialFill < 0 || cfg.InitialFill > cfg.Total:
		return usageError("invalid --initial-fill %d: must be between 0 and the total %d", cfg.InitialFill, cfg.Total)
	case cfg.LowWatermark < 0 || cfg.LowWatermark > segments.MaxTotal:
		return usageError("invalid --low-watermark %d: must be between 0 and %d", cfg.LowWatermark, segments.MaxTotal)
	case cfg.RefillBatch < 0 || cfg.RefillBatch > segments.MaxTotal:
		return usageError("invalid --refill-batch %d: must be between 0 and %d (0: the default)", cfg.RefillBatch, segments.MaxTotal)
	case cfg.PerUserLimit < 0 || cfg.PerUserLimit > segments.MaxQty:
		return usageError("invalid --per-user-limit %d: must be between 0 (no limit) and %d", cfg.PerUserLimit, segments.MaxQty)
	}
	return nil
}
