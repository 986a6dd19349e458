package embedetcd

import (
	"fmt"
	"strings"
	"sync/atomic"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// shutdownNoise is what embed.Etcd logs at level error, with a stack trace,
// for every listener and HTTP server it closes itself during a normal Close
// ("http: Server closed", "use of closed network connection", ...).
const shutdownNoise = "setting up serving from embedded etcd failed."

// cancelledReadNoise is what etcd logs at level error, with a stack trace,
// whenever a client gives up on a read-only transaction (its ctx was
// cancelled or timed out): the client's choice, not a server failure.
const cancelledReadNoise = "unexpected error during readonly txn"

// newLogger builds etcd's logger: stderr only, at level, and without the
// error-level noise etcd emits while we are deliberately shutting it down.
// Those entries are only dropped once closing is set, so the same message
// during startup or normal running (a real failure) still shows.
func newLogger(level string, closing *atomic.Bool) (*zap.Logger, error) {
	var lvl zapcore.Level
	// etcd's own level parser panics on unknown levels, so parse it here.
	if err := lvl.Set(level); err != nil {
		return nil, fmt.Errorf("embedetcd: LogLevel %q: %w", level, err)
	}
	zcfg := logutil.DefaultZapLoggerConfig
	zcfg.Level = zap.NewAtomicLevelAt(lvl)
	zcfg.OutputPaths = []string{"stderr"}
	zcfg.ErrorOutputPaths = []string{"stderr"}
	lg, err := zcfg.Build(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return &quietShutdownCore{Core: c, closing: closing}
	}))
	if err != nil {
		return nil, fmt.Errorf("embedetcd: build etcd logger: %w", err)
	}
	return lg, nil
}

type quietShutdownCore struct {
	zapcore.Core
	closing *atomic.Bool
}

func (c *quietShutdownCore) With(fields []zapcore.Field) zapcore.Core {
	return &quietShutdownCore{Core: c.Core.With(fields), closing: c.closing}
}

func (c *quietShutdownCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if ent.Message == shutdownNoise && c.closing.Load() {
		return ce
	}
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c) // so that Write can look at the fields
	}
	return ce
}

func (c *quietShutdownCore) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	if ent.Message == cancelledReadNoise && clientCancelled(fields) {
		return nil
	}
	return c.Core.Write(ent, fields)
}

// clientCancelled reports whether the entry's error is a client's ctx ending.
func clientCancelled(fields []zapcore.Field) bool {
	for _, f := range fields {
		if err, ok := f.Interface.(error); ok && f.Type == zapcore.ErrorType {
			msg := err.Error()
			return strings.Contains(msg, "context canceled") || strings.Contains(msg, "context deadline exceeded")
		}
	}
	return false
}
