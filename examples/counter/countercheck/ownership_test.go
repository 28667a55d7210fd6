package countercheck

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two members' logs: m1 holds [0, 8000…) as primary from :01 and demotes at :03; m2 takes it
// from :04. A lease that ended closes every window at its end, not at the log line's time.
const (
	m1Log = `{"time":"2026-11-27T10:00:01Z","msg":"primary from","start":"0000000000000000","end":"8000000000000000","token":2}
{"time":"2026-11-27T10:00:02Z","msg":"something else"}
not json: a panic's trace
{"time":"2026-11-27T10:00:03Z","msg":"primary until","start":"0000000000000000","end":"4000000000000000"}
{"time":"2026-11-27T10:00:05Z","msg":"primary from","start":"c000000000000000","end":"","token":5}
{"time":"2026-11-27T10:00:09Z","msg":"the lease on primary roles ended unrenewed: demoting the primary ranges","ended":"2026-11-27T10:00:06Z"}
`
	m2Log = `{"time":"2026-11-27T10:00:04Z","msg":"primary from","start":"0000000000000000","end":"4000000000000000","token":4}
{"time":"2026-11-27T10:00:07Z","msg":"primary from","start":"e000000000000000","end":"","token":8}
`
)

func TestOwnershipWindows(t *testing.T) {
	w1, err := Windows("m1", strings.NewReader(m1Log))
	require.NoError(t, err)
	var got []string
	for _, w := range w1 {
		got = append(got, w.String())
	}
	assert.ElementsMatch(t, []string{
		"m1 [0000000000000000, 3fffffffffffffff] token 2 from 10:00:01.000 until 10:00:03.000",
		"m1 [4000000000000000, 7fffffffffffffff] token 2 from 10:00:01.000 until 10:00:06.000",
		"m1 [c000000000000000, ffffffffffffffff] token 5 from 10:00:05.000 until 10:00:06.000",
	}, got)
	w2, err := Windows("m2", strings.NewReader(m2Log))
	require.NoError(t, err)
	assert.Empty(t, Overlaps(append(w1, w2...)), "m2 took over after m1's windows ended")
}

// The checker catches two primaries: m1's lease never ends in its log, so its window over
// [c000…, end) is still open when m2 takes part of it.
func TestOwnershipOverlapsFindTwoPrimaries(t *testing.T) {
	w1, err := Windows("m1", strings.NewReader(strings.Split(m1Log, "\n{\"time\":\"2026-11-27T10:00:09Z\"")[0]))
	require.NoError(t, err)
	w2, err := Windows("m2", strings.NewReader(m2Log))
	require.NoError(t, err)
	got := Overlaps(append(w1, w2...))
	require.Len(t, got, 1)
	assert.Contains(t, got[0], "m1 [c000000000000000, ffffffffffffffff] token 5")
	assert.Contains(t, got[0], "m2 [e000000000000000, ffffffffffffffff] token 8")
}
