package cli

import (
	"log/slog"
	"strings"
	"testing"
)

func TestLineHandler(t *testing.T) {
	var b strings.Builder
	l := slog.New(newLineHandler(&b, slog.LevelInfo)).With("identity", "r1")
	l.Debug("not shown")
	l.Info("rebalancer elected", "lease", "1a2b")
	l.Warn("etcd session lost; locks held under it are lost", "lease", "3c4d")
	want := "stockctl: rebalancer elected identity=r1 lease=1a2b\n" +
		"stockctl: warn: etcd session lost; locks held under it are lost identity=r1 lease=3c4d\n"
	if b.String() != want {
		t.Fatalf("got %q, want %q", b.String(), want)
	}
}
