package source

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

func TestParseKeyReadsBackWhatFormatKeyWrites(t *testing.T) {
	for _, c := range []struct {
		key  string
		frag string
	}{
		{"a", ""}, {"user:1", ""}, {"a/b\x00c", "kw/1"}, {"k", "/"}, {"k", "msg/1/"}, {"\xff\xfe", "\x00"},
	} {
		k := FormatKey("/data/", []byte(c.key), c.frag)
		hash, key, frag, err := ParseKey("/data/", []byte(k))
		require.NoError(t, err, k)
		assert.Equal(t, keyspace.Hash([]byte(c.key)), hash)
		assert.Equal(t, []byte(c.key), key)
		assert.Equal(t, c.frag, frag)
	}
}

func TestParseKeyRejectsEveryOtherForm(t *testing.T) {
	const p = "/data/"
	item := FormatKey(p, []byte("user:1"), "")
	hash, enc := item[len(p):len(p)+16], item[len(p)+17:]
	other := FormatKey(p, []byte("user:2"), "")[len(p) : len(p)+16]
	for _, c := range []struct {
		name string
		key  string
		want RejectReason
	}{
		{"another prefix", "/other/" + hash + "/" + enc, RejectShape},
		{"the prefix alone", p, RejectShape},
		{"no key", p + hash, RejectShape},
		{"no key after the slash", p + hash + "/", RejectShape},
		{"a key too short to encode anything", p + hash + "/Q", RejectShape},
		{"a short hash", p + hash[1:] + "/" + enc, RejectShape},
		{"a long hash", p + "0" + hash + "/" + enc, RejectShape},
		{"a hash that is not hex", p + "zz" + hash[2:] + "/" + enc, RejectHash},
		{"an upper-case hash", p + strings.ToUpper(hash) + "/" + enc, RejectHash},
		{"a signed hash", p + "+" + hash[1:] + "/" + enc, RejectHash},
		{"a key that is not base64url", p + hash + "/" + enc + "*", RejectKey},
		{"a padded key", p + hash + "/" + enc + "==", RejectKey},
		{"standard base64", p + hash + "/" + strings.ReplaceAll(enc, "_", "/") + "+", RejectKey},
		{"a newline in the key", p + hash + "/" + enc[:2] + "\n" + enc[2:], RejectKey},
		{"a key with stray low bits", strings.TrimSuffix(FormatKey(p, []byte("a"), ""), "YQ") + "YR", RejectKey},
		{"an empty fragment ID", item + "/", RejectEmptyFragment},
		{"another key's hash", p + other + "/" + enc, RejectHashMismatch},
		{"another key's hash, as a fragment", p + other + "/" + enc + "/f", RejectHashMismatch},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, key, frag, err := ParseKey(p, []byte(c.key))
			var ke *KeyError
			require.True(t, errors.As(err, &ke), "%q parsed as %q fragment %q", c.key, key, frag)
			assert.Equal(t, c.want, ke.Reason)
			assert.Contains(t, err.Error(), string(c.want))
		})
	}
}

func TestKeyErrorsQuoteABoundedPartOfTheKey(t *testing.T) {
	long := "/data/" + strings.Repeat("x", 10_000)
	_, _, _, err := ParseKey("/data/", []byte(long))
	require.Error(t, err)
	assert.Less(t, len(err.Error()), 300)
	assert.Contains(t, err.Error(), "10006 bytes")
}

// FuzzParseKey checks that ParseKey never panics, accepts only the keys FormatKey writes (so
// that no two etcd keys name one item or fragment), and reads each back as written.
func FuzzParseKey(f *testing.F) {
	const p = "/data/"
	f.Add([]byte(FormatKey(p, []byte("user:1"), "")), []byte("user:1"), "")
	f.Add([]byte(FormatKey(p, []byte("a/b"), "kw/1")), []byte("a/b"), "kw/1")
	f.Add([]byte(FormatKey(p, []byte("k"), "")+"/"), []byte("k"), "/")
	f.Add([]byte(p+"0000000000000000/QQ"), []byte{0}, "x")
	f.Fuzz(func(t *testing.T, k, key []byte, frag string) {
		if hash, got, gotFrag, err := ParseKey(p, k); err == nil {
			if again := FormatKey(p, got, gotFrag); again != string(k) {
				t.Fatalf("%q parses as (%q, %q), which formats as %q", k, got, gotFrag, again)
			}
			if hash != keyspace.Hash(got) {
				t.Fatalf("%q: hash %x is not the key's", k, hash)
			}
		} else if !errors.As(err, new(*KeyError)) {
			t.Fatalf("%q: %v is not a KeyError", k, err)
		}
		if len(key) == 0 {
			return // not an item key: Put refuses it
		}
		formatted := FormatKey(p, key, frag)
		hash, got, gotFrag, err := ParseKey(p, []byte(formatted))
		if err != nil || hash != keyspace.Hash(key) || !bytes.Equal(got, key) || gotFrag != frag {
			t.Fatalf("(%q, %q) formats as %q, which parses as (%x, %q, %q, %v)", key, frag, formatted, hash, got, gotFrag, err)
		}
	})
}
