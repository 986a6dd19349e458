package cli

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// updateDocs rewrites the docs' checked blocks from a real run:
// go test ./cmd/stockctl/cli -run TestDocs -update-docs
var updateDocs = flag.Bool("update-docs", false, "rewrite the docs' checked blocks (<!-- checked: NAME -->) from a real run")

const (
	readmePath = "../../../README.md"
	cliDocPath = "../../../docs/cli.md"
)

// The tours in the docs are what a newcomer sees: README.md's commands,
// run one after another on a fresh embedded etcd, print exactly what
// docs/cli.md's transcript of them shows (revisions, leases, times and
// host names aside), and the same holds for cli.md's reservations
// example. The transcripts are made by this test (-update-docs), never by
// hand, so they cannot drift.
func TestDocsTour(t *testing.T) {
	t.Parallel()
	readme := checkedBlock(t, readmePath, "tour")
	var cmds []string
	for _, line := range strings.Split(readme, "\n") {
		if line = stripComment(line); line != "" {
			cmds = append(cmds, line)
		}
	}
	if tour := transcriptCommands(checkedBlock(t, cliDocPath, "tour")); !*updateDocs && !slices.Equal(tour, cmds) {
		t.Errorf("docs/cli.md's tour runs %q,\nREADME.md's runs %q", tour, cmds)
	}
	checkTranscript(t, cliDocPath, "tour", cmds)
	checkTranscript(t, cliDocPath, "reservations", transcriptCommands(checkedBlock(t, cliDocPath, "reservations")))
}

// checkTranscript runs cmds in order on an embedded etcd of their own, and
// compares what they print with the doc's block, or rewrites the block.
func checkTranscript(t *testing.T, path, name string, cmds []string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "stockctl.etcd")
	var got strings.Builder
	for _, line := range cmds {
		cmd, echoExit := strings.CutSuffix(stripComment(line), `; echo "exit $?"`)
		args := shellWords(t, cmd)
		if len(args) == 0 || args[0] != "stockctl" {
			t.Fatalf("%s %s: %q is not a stockctl command", path, name, line)
		}
		r := run(t, append([]string{"--data-dir", dir}, args[1:]...)...)
		// The data dir as a newcomer's would be named: the default.
		fmt.Fprintf(&got, "$ %s\n%s%s", line, r.stdout, strings.ReplaceAll(r.stderr, dir, DefaultDataDir))
		if echoExit {
			fmt.Fprintf(&got, "exit %d\n", r.code)
		} else if r.code != 0 {
			t.Errorf("%s %s: %q exited %d: %s", path, name, line, r.code, r.stderr)
		}
		if !strings.HasSuffix(got.String(), "\n") {
			got.WriteString("\n")
		}
		got.WriteString("\n")
	}
	out := strings.TrimRight(got.String(), "\n")
	if *updateDocs {
		replaceCheckedBlock(t, path, name, out)
		return
	}
	want := checkedBlock(t, path, name)
	if normalizeRun(want) != normalizeRun(out) {
		t.Errorf("%s's %s block does not match a real run (go test ./cmd/stockctl/cli -run TestDocsTour -update-docs rewrites it):\n--- doc\n%s\n--- run\n%s",
			path, name, want, out)
	}
}

// checkedBlock is the code block that follows "<!-- checked: name -->" in path.
func checkedBlock(t *testing.T, path, name string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(raw), "<!-- checked: "+name+" -->\n")
	if !ok {
		t.Fatalf("%s has no <!-- checked: %s --> block", path, name)
	}
	_, rest, _ = strings.Cut(rest, "\n") // the opening fence
	body, _, ok := strings.Cut(rest, "\n```\n")
	if !ok {
		t.Fatalf("%s: the %s block does not end", path, name)
	}
	return body
}

func replaceCheckedBlock(t *testing.T, path, name, body string) {
	t.Helper()
	old := checkedBlock(t, path, name)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	marker := "<!-- checked: " + name + " -->\n"
	i := strings.Index(string(raw), marker)
	j := i + len(marker) + strings.Index(string(raw[i+len(marker):]), old)
	out := string(raw[:j]) + body + string(raw[j+len(old):])
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
}

// transcriptCommands are the "$ " lines of a transcript, without the "$ ".
func transcriptCommands(block string) []string {
	var cmds []string
	for _, line := range strings.Split(block, "\n") {
		if c, ok := strings.CutPrefix(line, "$ "); ok {
			cmds = append(cmds, c)
		}
	}
	return cmds
}

// stripComment removes a trailing "# comment" outside quotes, and spaces.
func stripComment(line string) string {
	quote := byte(0)
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case quote != 0 && c == quote:
			quote = 0
		case quote == 0 && (c == '\'' || c == '"'):
			quote = c
		case quote == 0 && c == '#' && (i == 0 || line[i-1] == ' '):
			return strings.TrimSpace(line[:i])
		}
	}
	return strings.TrimSpace(line)
}

// shellWords splits a command line as sh would, for the quoting the docs
// use: words separated by spaces, '…' and "…" quoted.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote != 0 && c == quote:
			quote = 0
		case quote != 0:
			w.WriteByte(c)
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == ' ':
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteByte(c)
			in = true
		}
	}
	if quote != 0 {
		t.Fatalf("unbalanced quote in %q", line)
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

// volatile are the parts of a run that differ from one run to the next:
// revisions (and the fencing tokens and revisions derived from them),
// leases, times, the host and pid of an identity, sizes.
var volatile = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?Z?`), "TIME"},
	{regexp.MustCompile(`(?i)(revision"?:?\s+|token\s+|TOKEN\s+)\d+`), "${1}N"},
	{regexp.MustCompile(`\b[0-9a-f]{16}\b`), "LEASE"},
	{regexp.MustCompile(`((?:LEADER|REBALANCER)\s+|"leader":\s*")[^\s,"/]+/\d+`), "${1}HOST/PID"},
	{regexp.MustCompile(`\d+(\.\d)? (KiB|MiB|GiB)`), "SIZE"},
}

func normalizeRun(s string) string {
	for _, v := range volatile {
		s = v.re.ReplaceAllString(s, v.with)
	}
	// Column widths follow the widest value: let them vary.
	return regexp.MustCompile(`[ \t]+`).ReplaceAllString(s, " ")
}

// Every table in the docs is whole: a header, its separator, and rows
// with as many cells as the header, with no blank line between them (a
// blank line ends a table; the rows after it show as plain text).
func TestDocsTables(t *testing.T) {
	t.Parallel()
	paths, err := filepath.Glob("../../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	cells := func(line string) int {
		n := 0
		for i := 0; i < len(line); i++ {
			if line[i] == '|' && (i == 0 || line[i-1] != '\\') {
				n++
			}
		}
		return n - 1
	}
	for _, path := range append(paths, readmePath) {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(raw), "\n")
		width, fence := 0, false // width: the current table's cells, 0 outside a table
		for i, line := range lines {
			if strings.HasPrefix(line, "```") {
				fence = !fence
			}
			if fence || !strings.HasPrefix(line, "|") {
				width = 0
				continue
			}
			switch {
			case width == 0 && i+1 < len(lines) && (strings.HasPrefix(lines[i+1], "|-") || strings.HasPrefix(lines[i+1], "|:")):
				width = cells(line)
			case width == 0:
				t.Errorf("%s:%d: a table row outside a table (a blank line above it?): %.60s", path, i+1, line)
			case cells(line) != width:
				t.Errorf("%s:%d: %d cells in a table of %d: %.60s", path, i+1, cells(line), width, line)
			}
		}
	}
}
