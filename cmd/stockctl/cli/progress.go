package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/stockctl/stockctl/cmd/stockctl/sale"
)

// progressLine draws the demo's live progress on one line of stderr,
// rewriting it with "\r"; stdout stays clean for -o json.
type progressLine struct {
	w     io.Writer // nil: no progress line
	total int64
	width int // of the last line drawn, to blank it out
}

func newProgressLine(w io.Writer, mode string, total int64) *progressLine {
	p := &progressLine{total: total}
	if mode == "always" || (mode == "auto" && isTerminal(w)) {
		p.w = w
	}
	return p
}

func (p *progressLine) update(pr sale.Progress) {
	if p.w == nil {
		return
	}
	if pr.Done {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.width))
		return
	}
	line := fmt.Sprintf("selling: %d/%d units · %d orders · %.0f orders/s · %d refusals · %d errors · %d buyers · %.1fs",
		pr.Units, p.total, pr.Orders, pr.Rate, pr.Refusals, pr.Errors, pr.Buyers, pr.Elapsed.Seconds())
	pad := max(0, p.width-len(line))
	p.width = len(line)
	fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", pad))
}
