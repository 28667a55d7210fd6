package boltstore

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
)

// TestFragPrefixDisjoint checks the fragment key layout where the conformance suite cannot:
// for keys of the same hash (a collision), where only the key's length keeps one item's
// fragments from reading as another's.
func TestFragPrefixDisjoint(t *testing.T) {
	hash := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	keys := []string{"a", "ab", "a\x00", "\x01a", "\x02", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}
	ids := []string{"a", "b", "\x00", "bc", "\x01a"}
	for _, k1 := range keys {
		for _, k2 := range keys {
			if k1 == k2 {
				continue
			}
			for _, id := range ids {
				fk := append(fragPrefix(hash, []byte(k2)), id...)
				assert.False(t, bytes.HasPrefix(fk, fragPrefix(hash, []byte(k1))),
					"fragment %q of %q reads as a fragment of %q", id, k2, k1)
			}
		}
	}
}

func TestEndEncoding(t *testing.T) {
	for _, b := range []client.Bound{client.BoundAt(0), client.BoundAt(1), client.BoundAt(1<<64 - 1), client.EndOfSpace()} {
		got, ok := decodeEnd(encodeEnd(b))
		require.True(t, ok, "%s", b)
		assert.Equal(t, b, got)
	}
	for _, v := range [][]byte{nil, {0}, {2}, make([]byte, 7), make([]byte, 9)} {
		_, ok := decodeEnd(v)
		assert.False(t, ok, "%x", v)
	}
}
