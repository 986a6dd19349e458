package cli

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stockctl/stockctl/internal/etcdtest"
)

// (The tests of --log-level live here, next to status --watch's, because
// this change's tests are kept to new watch_*_test.go files.)

// A --log-level other than the four names is a usage error that names
// it, from the flag and from STOCKCTL_LOG_LEVEL alike, before etcd is
// contacted.
func TestLogLevelUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		args  []string
		want  string
		valid bool
	}{
		{name: "unknown", args: []string{"--log-level", "loud"}, want: `invalid --log-level "loud": want debug, info, warn or error`},
		{name: "slog syntax", args: []string{"--log-level", "warn+2"}, want: `invalid --log-level "warn+2"`},
		{name: "empty", args: []string{"--log-level", ""}, want: `invalid --log-level ""`},
		{name: "upper case", args: []string{"--log-level", "WARN"}, valid: true},
		{name: "debug", args: []string{"--log-level", "debug"}, valid: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// An endpoint nobody listens on: a valid level gets as far as
			// dialling it and fails there (exit 1), an invalid one never does.
			args := append(tc.args, "--endpoints", "127.0.0.1:1", "--dial-timeout", "1ms", "status", "x")
			r := run(t, args...)
			if tc.valid {
				if r.code != ExitFailure || strings.Contains(r.stderr, "log-level") {
					t.Fatalf("%v: exit %d, stderr %q; want a failure to reach etcd", args, r.code, r.stderr)
				}
				return
			}
			checkFails(t, r, ExitUsage, tc.want, args)
		})
	}
}

// STOCKCTL_LOG_LEVEL is read like the flag. (Not parallel: the
// environment is the whole process's.)
func TestLogLevelEnv(t *testing.T) {
	t.Setenv("STOCKCTL_LOG_LEVEL", "verbose")
	args := []string{"--endpoints", "127.0.0.1:1", "status", "x"}
	checkFails(t, run(t, args...), ExitUsage, `invalid --log-level "verbose": want debug, info, warn or error`, args)
}

// The rebalancer's leadership lines are info records: --log-level info
// (the default) and debug show them on stderr, warn and error do not.
func TestLogLevelRebalancerLines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		level string // "" for the default
		shown bool
	}{
		{level: "", shown: true},
		{level: "debug", shown: true},
		{level: "info", shown: true},
		{level: "warn", shown: false},
		{level: "error", shown: false},
	} {
		name := tc.level
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			identity := "lvl-" + name
			e.ok("init", "lv", "--total", "20", "--segments", "1", "--initial-fill", "4", "--low-watermark", "3", "--refill-batch", "2")
			args := []string{"rebalance", "--watch", "lv", "--identity", identity}
			if tc.level != "" {
				args = append([]string{"--log-level", tc.level}, args...)
			}
			w := startWatch(t, e.args(args...)...)
			// A move is made after the election and its line: once the
			// move is printed, the line is on stderr if it ever will be.
			for i := range 2 {
				e.ok("allocate", "lv", "--order", fmt.Sprintf("o%d", i), "--qty", "1")
			}
			etcdtest.WaitFor(t, "a refill", 30*time.Second, func() bool { return strings.Contains(w.out.String(), "refill  lv  pool → seg/0") })
			if code := w.stop(t); code != ExitOK {
				t.Fatalf("rebalance --watch exited %d: %s", code, w.errOut.String())
			}
			stderr := w.errOut.String()
			line := "stockctl: rebalancer elected identity=" + identity + " lease="
			if got := strings.Contains(stderr, line); got != tc.shown {
				t.Fatalf("--log-level %q: the leadership line shown %v, want %v; stderr:\n%s", tc.level, got, tc.shown, stderr)
			}
			if strings.Contains(stderr, "stockctl: debug: ") != (tc.level == "debug") {
				t.Fatalf("--log-level %q: debug records shown or hidden wrongly; stderr:\n%s", tc.level, stderr)
			}
		})
	}
}
