// Package etcdlog writes the logs of etcd (its embedded server and its client), which use zap,
// to a slog logger, so that a process logs in one format.
package etcdlog

import (
	"context"
	"log/slog"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// slogCore is a zap core that writes to a slog logger. Once closing is set it drops entries
// at error level: a closing etcd server logs its listeners' closing as errors, but a normal
// shutdown is not an error.
type slogCore struct {
	log     *slog.Logger
	level   zapcore.Level
	fields  []zapcore.Field
	closing *atomic.Bool
}

// New returns a zap logger that writes entries at level or above to log. If closing is not
// nil, entries at error level are dropped once it is set.
func New(log *slog.Logger, level zapcore.Level, closing *atomic.Bool) *zap.Logger {
	if closing == nil {
		closing = &atomic.Bool{}
	}
	return zap.New(&slogCore{log: log.With("component", "etcd"), level: level, closing: closing})
}

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= c.level }

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	out := *c
	out.fields = append(append([]zapcore.Field(nil), c.fields...), fields...)
	return &out
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	if c.closing.Load() && e.Level >= zapcore.ErrorLevel {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range append(c.fields, fields...) {
		f.AddTo(enc)
	}
	attrs := make([]slog.Attr, 0, len(enc.Fields))
	for k, v := range enc.Fields {
		attrs = append(attrs, slog.Any(k, v))
	}
	c.log.LogAttrs(context.Background(), slogLevel(e.Level), e.Message, attrs...)
	return nil
}

func (c *slogCore) Sync() error { return nil }

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l >= zapcore.ErrorLevel:
		return slog.LevelError
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	}
	return slog.LevelDebug
}
