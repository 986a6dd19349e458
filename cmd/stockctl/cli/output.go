package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// table is what a result looks like as text: key-value lines, then a grid
// under a header, then notes. Commands build it from their result; render
// prints it. Building and printing are kept apart so that the rows can be
// tested without parsing text.
type table struct {
	kv     [][2]string
	header []string
	rows   [][]string
	notes  []string
}

func (t *table) add(key string, value any) {
	t.kv = append(t.kv, [2]string{key, fmt.Sprint(value)})
}

// tabular is a command's result: it marshals to JSON as the -o json
// contract and builds its own table.
type tabular interface {
	table() table
}

// render writes v to w as JSON or as a table.
func render(w io.Writer, output string, v tabular) error {
	if output == outputJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return writeTable(w, v.table())
}

func writeTable(w io.Writer, t table) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, kv := range t.kv {
		fmt.Fprintf(tw, "%s\t%s\n", kv[0], kv[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(t.header) > 0 {
		if len(t.kv) > 0 {
			fmt.Fprintln(w)
		}
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(t.header, "\t"))
		for _, r := range t.rows {
			fmt.Fprintln(tw, strings.Join(r, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, n := range t.notes {
		fmt.Fprintln(w, n)
	}
	return nil
}

// barWidth is the width, in characters, of a full bar in status and demo
// tables.
const barWidth = 30

// eighths are the partial block characters, 1/8 to 7/8 of a cell.
var eighths = []rune("▏▎▍▌▋▊▉")

// bar draws v on a scale where full is barWidth cells, in eighths of a
// cell. Anything above zero gets at least a sliver, so a nearly empty
// segment never looks empty; a value above full ends in "▸".
func bar(v, full int64) string {
	if v <= 0 || full <= 0 {
		return ""
	}
	over := v > full
	v = min(v, full)
	n := int((v*barWidth*8 + full/2) / full) // eighths, rounded
	n = max(n, 1)
	s := strings.Repeat("█", n/8)
	if r := n % 8; r > 0 {
		s += string(eighths[r-1])
	}
	if over {
		s += "▸"
	}
	return s
}
