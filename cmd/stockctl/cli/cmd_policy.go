package cli

import (
	"context"
	"fmt"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/segments"
)

func policyCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "policy",
		Usage: "change a SKU's refill policy mid-sale",
		Description: "Sets the low watermark (the rebalancer refills a segment holding less) and the refill batch\n" +
			"(what it moves at once; 0: total/(4×segments)); a flag not given keeps its value. The elected\n" +
			"rebalancer applies it from its next decision on. A selling process pulls from the pool at least\n" +
			"the refill batch it first read, until it restarts.",
		ArgsUsage: "SKU [--low-watermark N] [--refill-batch N]",
		Flags: []ucli.Flag{
			&ucli.Int64Flag{Name: "low-watermark", Usage: "refill a segment holding less than this"},
			&ucli.Int64Flag{Name: "refill-batch", Usage: "units per refill (0: the default, total/(4×segments))"},
		},
		Action: policyAction,
	}
}

// policyView is the result of policy: the SKU's policy now.
type policyView struct {
	SKU          string `json:"sku"`
	LowWatermark int64  `json:"lowWatermark"`
	RefillBatch  int64  `json:"refillBatch"`
}

func (v policyView) table() table {
	var t table
	t.add("SKU", v.SKU)
	t.add("LOW WATERMARK", v.LowWatermark)
	t.add("REFILL BATCH", v.RefillBatch)
	t.add("POLICY", fmt.Sprintf("refill %d when a segment holds less than %d", v.RefillBatch, v.LowWatermark))
	return t
}

func policyAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	sku, err := oneArg(c, "SKU", segments.ValidateSKU)
	if err != nil {
		return err
	}
	if !c.IsSet("low-watermark") && !c.IsSet("refill-batch") {
		return usageError("nothing to change: give --low-watermark, --refill-batch or both (usage: stockctl policy %s)", c.Command.ArgsUsage)
	}
	low, batch := int64(-1), int64(-1) // -1: keep
	if c.IsSet("low-watermark") {
		if low = c.Int64("low-watermark"); low < 0 || low > segments.MaxTotal {
			return usageError("invalid --low-watermark %d: must be between 0 and %d", low, segments.MaxTotal)
		}
	}
	if c.IsSet("refill-batch") {
		if batch = c.Int64("refill-batch"); batch < 0 || batch > segments.MaxTotal {
			return usageError("invalid --refill-batch %d: must be between 0 (the default) and %d", batch, segments.MaxTotal)
		}
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		where, err := cn.coord.ClusterOf(ctx, sku)
		if err != nil {
			return opFailed(ctx, err)
		}
		m, err := engines.Of(clusterCoord(cn.coord, where)).Stock.SetPolicy(ctx, sku, low, batch)
		if err != nil {
			return opFailed(ctx, err)
		}
		return show(c, g, policyView{SKU: sku, LowWatermark: m.LowWatermark, RefillBatch: m.RefillBatch})
	})
}
