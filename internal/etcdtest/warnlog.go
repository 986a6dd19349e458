package etcdtest

import (
	"context"
	"log/slog"
	"slices"
	"sync"
)

// WarnLog is a slog handler that keeps the messages logged at Warn and
// above, for tests that assert what a component logged (or that it logged
// nothing): slog.New(&w) as the component's logger, then w.Messages().
type WarnLog struct {
	mu   sync.Mutex
	msgs []string
}

func (w *WarnLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *WarnLog) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w *WarnLog) WithGroup(string) slog.Handler                { return w }

func (w *WarnLog) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, r.Message)
	return nil
}

// Messages returns the messages logged so far, oldest first.
func (w *WarnLog) Messages() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.msgs)
}
