package kvclient_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
)

func TestSliceRoundTrips(t *testing.T) {
	for _, r := range []client.Range{
		client.FullRange(),
		{Start: 1 << 62, End: client.BoundAt(1<<63 + 5)},
		{Start: 1<<64 - 1, End: client.EndOfSpace()},
	} {
		s := kvclient.SliceOf(r)
		got, err := s.Range()
		require.NoError(t, err, "%+v", s)
		assert.Equal(t, r, got)
	}
	assert.Equal(t, kvclient.Slice{Start: "0x4000000000000000", End: "end"},
		kvclient.SliceOf(client.Range{Start: 1 << 62, End: client.EndOfSpace()}), "the API's form: hex points, the end as end")
}

func TestSliceRejectsWhatIsNoRange(t *testing.T) {
	for name, s := range map[string]kvclient.Slice{
		"start at the end": {Start: "end", End: "end"},
		"empty":            {Start: "0x10", End: "0x10"},
		"backwards":        {Start: "0x10", End: "0x0f"},
		"not a point":      {Start: "x", End: "end"},
		"not a bound":      {Start: "0", End: "later"},
	} {
		_, err := s.Range()
		assert.Error(t, err, name)
	}
}
