package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// logLevelNames are the values of --log-level, for its help and errors.
const logLevelNames = "debug, info, warn or error"

// parseLogLevel reads --log-level. Only the four names are accepted (in any
// case): slog's own syntax ("warn+2") would be one more thing to document.
func parseLogLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, usageError("invalid --log-level %q: want %s", s, logLevelNames)
}

// logger is the logger handed to the coordinator and the rebalancer: their
// records of --log-level and above, as lines on w (the command's stderr).
func (g *globals) logger(w io.Writer) *slog.Logger {
	return slog.New(newLineHandler(w, g.logLevel))
}

// newLineHandler returns a handler writing records of level and above to w.
func newLineHandler(w io.Writer, level slog.Level) *lineHandler {
	return &lineHandler{mu: new(sync.Mutex), w: w, level: level}
}

// lineHandler writes the library's log records as stockctl's own lines:
// "stockctl: warn: etcd session lost; ... lease=1a2b". Info records have no
// level word; the others say theirs. Records come from background
// goroutines, so writes are serialised.
type lineHandler struct {
	mu    *sync.Mutex
	w     io.Writer
	level slog.Level
	attrs []slog.Attr
}

func (h *lineHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *lineHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString("stockctl: ")
	if r.Level >= slog.LevelWarn || r.Level < slog.LevelInfo {
		b.WriteString(strings.ToLower(r.Level.String()) + ": ")
	}
	b.WriteString(r.Message)
	write := func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	}
	for _, a := range h.attrs {
		write(a)
	}
	r.Attrs(write)
	b.WriteByte('\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := io.WriteString(h.w, b.String())
	return err
}

func (h *lineHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &lineHandler{mu: h.mu, w: h.w, level: h.level, attrs: append(append([]slog.Attr{}, h.attrs...), attrs...)}
}

// WithGroup flattens groups: the libraries log flat records.
func (h *lineHandler) WithGroup(string) slog.Handler { return h }
