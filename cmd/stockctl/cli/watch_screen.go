package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// ANSI sequences of the terminal view.
const (
	ansiHome       = "\x1b[H"    // cursor to the top left
	ansiClear      = "\x1b[2J"   // erase the screen
	ansiClearLine  = "\x1b[K"    // erase to the end of the line
	ansiClearBelow = "\x1b[J"    // erase from the cursor to the end of the screen
	ansiHideCursor = "\x1b[?25l" // no cursor jumping about while drawing
	ansiShowCursor = "\x1b[?25h"
)

// watchPrinter shows the frames of status --watch in one of three ways:
// on a terminal, each frame is drawn over the last one; otherwise each is
// printed after the last, as a block of plain lines or, with -o json, as
// one JSON object on one line. Off a terminal only frames that differ
// from the last one printed (their time aside) are printed.
type watchPrinter struct {
	w    io.Writer
	json bool
	tty  bool
	// title and the time make the first line of a frame on a terminal,
	// where (etcd and the prefix) the second: a narrow terminal cuts the
	// ends of lines, and each line starts with what matters most.
	title, where string

	// size is the terminal's size, 0 when unknown: a frame taller than
	// the terminal would scroll, and drawing over it would then misplace
	// every line.
	size func() (rows, cols int)

	drawn bool   // tty: the screen was cleared and the cursor hidden
	last  []byte // the last frame printed, without its time
}

func newWatchPrinter(w io.Writer, output string, tty bool, title, where string) *watchPrinter {
	p := &watchPrinter{w: w, json: output == outputJSON, title: title, where: where,
		size: func() (int, int) { return terminalSize(w) }}
	p.tty = tty && !p.json
	return p
}

// print shows v. It reports whether it printed anything and the error of
// writing.
func (p *watchPrinter) print(v watchView) (bool, error) {
	if p.tty {
		return true, p.draw(v)
	}
	same := v
	same.At = time.Time{}
	key, err := json.Marshal(same)
	if err != nil {
		return false, err
	}
	if v.Note == "" && bytes.Equal(key, p.last) {
		return false, nil
	}
	p.last = key
	if p.json {
		b, err := json.Marshal(v)
		if err == nil {
			_, err = fmt.Fprintf(p.w, "%s\n", b)
		}
		return true, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "--- %s\n", v.At.Local().Format("2006-01-02 15:04:05.000"))
	if err := writeTable(&b, v.table()); err != nil {
		return false, err
	}
	b.WriteByte('\n')
	_, err = io.WriteString(p.w, trimLines(b.String()))
	return true, err
}

// trimLines removes the spaces tabwriter pads an empty last column with
// (a free lock's HOLDER) from the end of every line.
func trimLines(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		b.WriteString(strings.TrimRight(line, " \n"))
		if strings.HasSuffix(line, "\n") {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// draw writes v over the previous frame: from the top left, each line
// erased to its end, and whatever a taller previous frame left below
// erased. Lines are cut to the terminal's size.
func (p *watchPrinter) draw(v watchView) error {
	var frame bytes.Buffer
	fmt.Fprintf(&frame, "%s · %s\n%s\n\n", v.At.Local().Format(time.TimeOnly), p.title, p.where)
	if err := writeTable(&frame, v.table()); err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSuffix(trimLines(frame.String()), "\n"), "\n")
	rows, cols := p.size()
	if rows > 1 && len(lines) > rows-1 {
		// The last row stays free: a line written there would scroll.
		cut := len(lines) - (rows - 2)
		lines = append(lines[:rows-2], fmt.Sprintf("… %d more lines: a taller terminal shows them", cut))
	}
	var b strings.Builder
	if !p.drawn {
		b.WriteString(ansiHideCursor + ansiHome + ansiClear)
		p.drawn = true
	}
	b.WriteString(ansiHome)
	for _, l := range lines {
		if cols > 1 {
			// One column short: erasing to the end of a line whose last
			// column is written erases that column on some terminals.
			l = cutRunes(l, cols-1)
		}
		b.WriteString(l + ansiClearLine + "\n")
	}
	b.WriteString(ansiClearBelow)
	_, err := io.WriteString(p.w, b.String())
	return err
}

// close gives the terminal its cursor back, below the last frame, which
// stays on the screen. The newline ends the line where the terminal
// echoed ^C, so that the shell's prompt starts on a line of its own.
func (p *watchPrinter) close() {
	if p.drawn {
		_, _ = io.WriteString(p.w, ansiShowCursor+"\n")
	}
}

// cutRunes cuts s to at most n characters (every character of a frame is
// one column wide).
func cutRunes(s string, n int) string {
	i := 0
	for j := range s {
		if i == n {
			return s[:j]
		}
		i++
	}
	return s
}
