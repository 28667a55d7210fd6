package etcdlog

import (
	"bytes"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestZapEntriesBecomeSlogRecords(t *testing.T) {
	var buf bytes.Buffer
	closing := &atomic.Bool{}
	log := New(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), zapcore.InfoLevel, closing)
	log.Debug("too quiet")
	log.With(zap.String("member", "m1")).Warn("slow fsync", zap.Int("ms", 120))
	log.Error("listener closed")
	closing.Store(true)
	log.Error("setting up serving failed")
	log.Info("still informative")

	out := buf.String()
	assert.NotContains(t, out, "too quiet", "below the level")
	assert.Contains(t, out, `level=WARN msg="slow fsync" component=etcd`)
	assert.Contains(t, out, "member=m1")
	assert.Contains(t, out, "ms=120")
	assert.Contains(t, out, `level=ERROR msg="listener closed"`)
	assert.NotContains(t, out, "setting up serving failed", "errors of a closing server are dropped")
	assert.Contains(t, out, "still informative")
}
