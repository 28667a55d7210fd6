package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestNewHonoursLevelAndFormat(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, "warn", "json")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("dropped")
	log.Warn("kept", "k", 1)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("want one JSON record, got %q: %v", buf.String(), err)
	}
	if rec["msg"] != "kept" || rec["k"] != float64(1) {
		t.Errorf("record %v", rec)
	}
}

func TestNewRejectsBadFlags(t *testing.T) {
	for _, c := range []struct{ level, format, want string }{
		{"loud", "text", "--log-level"},
		{"info", "xml", "--log-format"},
	} {
		if _, err := New(&bytes.Buffer{}, c.level, c.format); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%q, %q) = %v, want an error naming %s", c.level, c.format, err, c.want)
		}
	}
}
