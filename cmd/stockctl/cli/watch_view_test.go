package cli

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func testView(at time.Time, pool int64) watchView {
	return watchView{SKU: "x", At: at, Total: 100, Pool: pool, Allocated: 100 - pool - 20, full: 10,
		Segments: []watchSegmentView{
			{segmentView: segmentView{Index: 0, Remaining: 10}, Holder: "1a"},
			{segmentView: segmentView{Index: 1, Remaining: 10, Inbox: 4}, Holder: "2b", HolderIdentity: "shop-2", Waiting: 2},
		}}
}

// Off a terminal, a frame is printed only when what it shows changed (its
// time aside), or when it carries a note; never with escape codes.
func TestWatchPrinterPrintsChanges(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.Local)
	noted := testView(t0.Add(3*time.Second), 70)
	noted.Note = "reloaded at revision 9: the watch was lost"
	for _, output := range []string{outputTable, outputJSON} {
		t.Run(output, func(t *testing.T) {
			var b strings.Builder
			p := newWatchPrinter(&b, output, true /* a terminal, but not drawn on: tty is ignored with JSON */, "", "")
			if output == outputTable {
				p.tty = false
			}
			for i, tc := range []struct {
				v       watchView
				printed bool
			}{
				{testView(t0, 70), true},
				{testView(t0.Add(time.Second), 70), false}, // only the time changed
				{testView(t0.Add(2*time.Second), 60), true},
				{noted, true}, // the same figures, with a note
			} {
				printed, err := p.print(tc.v)
				if err != nil || printed != tc.printed {
					t.Fatalf("frame %d: printed %v, %v; want %v", i, printed, err, tc.printed)
				}
			}
			out := b.String()
			if strings.Contains(out, "\x1b") {
				t.Fatalf("escape codes:\n%q", out)
			}
			if strings.Contains(out, " \n") {
				t.Fatalf("a line ends in spaces:\n%q", out)
			}
			want := []string{"--- ", "\nPOOL       60\n", "\nWATCH      reloaded at revision 9", "\n1        10         4      " + strings.Repeat("█", barWidth) + "  shop-2 2b +2\n"}
			if output == outputJSON {
				if n := strings.Count(out, "\n"); n != 3 {
					t.Fatalf("%d lines, want 3:\n%s", n, out)
				}
				want = []string{`"pool":60`, `"note":"reloaded at revision 9: the watch was lost"`, `{"index":1,"remaining":10,"inbox":4,"holder":"2b","holderIdentity":"shop-2","waiting":2}`}
			}
			for _, w := range want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// On a terminal a frame is drawn over the last one, cut to the terminal's
// size so that it never scrolls.
func TestWatchPrinterDraws(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		rows, cols int
		cut        bool // a "… N more lines" last line
	}{
		{name: "size unknown", rows: 0, cols: 0},
		{name: "large", rows: 50, cols: 200},
		{name: "short and narrow", rows: 10, cols: 40, cut: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var b strings.Builder
			p := newWatchPrinter(&b, outputTable, true, "status --watch x · ^C to stop", "etcd http://127.0.0.1:2379, prefix /stockctl/")
			p.size = func() (int, int) { return tc.rows, tc.cols }
			t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.Local)
			for _, pool := range []int64{70, 60} {
				if _, err := p.print(testView(t0, pool)); err != nil {
					t.Fatal(err)
				}
			}
			p.close()
			out := b.String()
			if strings.Count(out, ansiClear) != 1 || !strings.HasPrefix(out, ansiHideCursor+ansiHome+ansiClear) {
				t.Fatalf("the screen is not cleared once, first:\n%q", out)
			}
			if !strings.HasSuffix(out, ansiClearBelow+ansiShowCursor+"\n") || strings.Count(out, ansiHome) != 3 {
				t.Fatalf("frames not drawn from the top left, or the cursor not given back:\n%q", out)
			}
			second := out[strings.LastIndex(out, ansiHome)+len(ansiHome) : strings.LastIndex(out, ansiClearBelow)]
			lines := strings.Split(strings.TrimSuffix(second, "\n"), "\n")
			for _, l := range lines {
				l = strings.TrimSuffix(l, ansiClearLine)
				if tc.cols > 0 && utf8.RuneCountInString(l) > tc.cols-1 {
					t.Errorf("line of %d columns on a terminal of %d: %q", utf8.RuneCountInString(l), tc.cols, l)
				}
			}
			if tc.rows > 0 && len(lines) > tc.rows-1 {
				t.Errorf("%d lines on a terminal of %d rows", len(lines), tc.rows)
			}
			if got := strings.Contains(second, " more lines"); got != tc.cut {
				t.Errorf("cut %v, want %v:\n%s", got, tc.cut, second)
			}
			if !strings.Contains(second, "POOL") || !strings.HasPrefix(second, "12:00:00 · status --watch x") {
				t.Errorf("frame:\n%s", second)
			}
			if !tc.cut && !strings.Contains(second, "\nPOOL       60"+ansiClearLine) {
				t.Errorf("the second frame does not show the second state:\n%s", second)
			}
		})
	}
}

// Rates count the events of the last watchRateWindow, over at least a
// second, and over less than the window while the watch is younger.
func TestRateWindow(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.Local)
	for _, tc := range []struct {
		name  string
		marks map[time.Duration]int // since t0
		now   time.Duration
		want  float64
	}{
		{name: "nothing", now: 10 * time.Second, want: 0},
		{name: "an early burst over a second", marks: map[time.Duration]int{100 * time.Millisecond: 30}, now: 200 * time.Millisecond, want: 30},
		{name: "young watch", marks: map[time.Duration]int{time.Second: 10, 2 * time.Second: 10}, now: 2 * time.Second, want: 10},
		{name: "full window", marks: map[time.Duration]int{6 * time.Second: 25, 9 * time.Second: 25}, now: 10 * time.Second, want: 10},
		{name: "old events fall out", marks: map[time.Duration]int{time.Second: 100, 8 * time.Second: 5}, now: 10 * time.Second, want: 1},
		{name: "all gone", marks: map[time.Duration]int{time.Second: 100}, now: 20 * time.Second, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var w rateWindow
			for d := time.Duration(0); d <= tc.now; d += 100 * time.Millisecond {
				w.add(t0.Add(d), tc.marks[d]) // in time order, as the watch adds them
			}
			if got := w.rate(t0.Add(tc.now), t0); got != tc.want {
				t.Fatalf("rate %v, want %v", got, tc.want)
			}
		})
	}
}
