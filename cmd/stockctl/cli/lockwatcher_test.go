//go:build linux

package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stockctl/stockctl/internal/etcdtest"
)

// Invariant (issue 28): the lock watcher, told nothing but the kill-by
// time, stops CMD's whole group when stockctl dies (its stdin closes
// without "done"): SIGTERM, then SIGKILL after --grace or at the kill-by
// time if that comes first; and leaves it alone after "done". CMD and its
// grandchild ignore SIGTERM, so only the SIGKILL ends them. With a grace of
// an hour, only the kill-by time can.
func TestLockWatcherStopsGroup(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		grace  time.Duration
		killBy bool // send a kill-by time already due
		done   bool // stockctl says done instead of dying
	}{
		{"kill-by before grace", time.Hour, true, false},
		{"grace without kill-by", 100 * time.Millisecond, false, false},
		{"done", 100 * time.Millisecond, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lw, err := startLockWatcher(tc.grace, true)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			gcFile := filepath.Join(dir, "grandchild")
			cmd := exec.Command("sh", "-c", `trap "" TERM; sleep 300 & echo $! > `+gcFile+`.tmp; mv `+gcFile+`.tmp `+gcFile+`; wait`)
			setProcessGroup(cmd, true)
			lw.joinGroup(cmd)
			if err := cmd.Start(); err != nil {
				lw.release()
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			var gc int
			t.Cleanup(func() {
				_ = syscall.Kill(-lw.pgid(), syscall.SIGKILL)
				<-exited
				lw.release()
			})
			etcdtest.WaitFor(t, "the grandchild to start", 60*time.Second, func() bool {
				b, err := os.ReadFile(gcFile)
				gc, _ = strconv.Atoi(strings.TrimSpace(string(b)))
				return err == nil && gc > 0
			})
			if tc.killBy {
				lw.setKillBy(monoNow())
			}
			if tc.done {
				lw.release()
				if !alive(cmd.Process.Pid) || !alive(gc) {
					t.Fatal("the watcher stopped CMD after done")
				}
				return
			}
			// stockctl's death, as the watcher sees it: its stdin closes.
			lw.hangUp("")
			select {
			case <-exited:
			case <-time.After(etcdtest.HangLimit(60 * time.Second)):
				t.Fatal("CMD still runs long after the watcher's stockctl died")
			}
			if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("CMD ended with %v, want SIGKILL (it ignores SIGTERM)", cmd.ProcessState)
			}
			etcdtest.WaitFor(t, "the grandchild to be gone", 60*time.Second, func() bool { return !alive(gc) })
		})
	}
}
