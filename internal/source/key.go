package source

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// RejectReason says why a key under a source's prefix is neither an item nor a fragment of
// one. The values are few and fixed: they label a metric.
type RejectReason string

// The reasons ParseKey gives.
const (
	// RejectShape: not 16 hex digits, "/", an encoded key and optionally "/" and a fragment ID.
	RejectShape RejectReason = "shape"
	// RejectHash: the 16 hash digits are not lowercase hexadecimal.
	RejectHash RejectReason = "hash"
	// RejectKey: the item key is not unpadded base64url in its one canonical form.
	RejectKey RejectReason = "key"
	// RejectEmptyFragment: a "/" after the key with no fragment ID behind it.
	RejectEmptyFragment RejectReason = "empty_fragment"
	// RejectHashMismatch: the hash is not xxhash64 of the key.
	RejectHashMismatch RejectReason = "hash_mismatch"
)

// RejectReasons lists every RejectReason, so that a metric can show each from the start.
var RejectReasons = []RejectReason{RejectShape, RejectHash, RejectKey, RejectEmptyFragment, RejectHashMismatch}

// KeyError is ParseKey's error: the key and why it was rejected.
type KeyError struct {
	Key    []byte
	Reason RejectReason
}

// maxQuoted bounds how much of a rejected key an error quotes: the key comes from whoever
// can write under the prefix.
const maxQuoted = 128

func (e *KeyError) Error() string {
	k := e.Key
	more := ""
	if len(k) > maxQuoted {
		k, more = k[:maxQuoted], fmt.Sprintf("... (%d bytes)", len(e.Key))
	}
	return fmt.Sprintf("source: %q%s is not an item key: %s", k, more, e.Reason)
}

var b64 = base64.RawURLEncoding.Strict()

// hashDigits is the width of the hash in a key: 16 hex digits, so that keys sort by hash.
const hashDigits = 16

// FormatKey returns the etcd key under prefix of item key, or of its fragment frag if frag
// is not "". It is the one key ParseKey reads back as (hash of key, key, frag).
func FormatKey(prefix string, key []byte, frag string) string {
	n := len(prefix) + hashDigits + 1 + b64.EncodedLen(len(key))
	if frag != "" {
		n += 1 + len(frag)
	}
	b := make([]byte, 0, n)
	b = append(b, prefix...)
	b = appendHash(b, keyspace.Hash(key))
	b = append(b, '/')
	b = b64.AppendEncode(b, key)
	if frag != "" {
		b = append(b, '/')
		b = append(b, frag...)
	}
	return string(b)
}

func appendHash(b []byte, h uint64) []byte {
	var digits [8]byte
	for i := range digits {
		digits[i] = byte(h >> (56 - 8*i))
	}
	return hex.AppendEncode(b, digits[:])
}

// ParseKey splits k, an etcd key under prefix, into the item key's hash, the item key and the
// fragment ID ("" for the item itself). It accepts exactly the keys FormatKey makes, so no
// two etcd keys name one item or fragment: anything else (upper-case hex, base64 that is not
// canonical, an empty fragment ID after a "/", a hash that is not the key's) is a *KeyError.
func ParseKey(prefix string, k []byte) (hash uint64, key []byte, frag string, err error) {
	reject := func(r RejectReason) (uint64, []byte, string, error) {
		return 0, nil, "", &KeyError{Key: k, Reason: r}
	}
	rest, ok := bytes.CutPrefix(k, []byte(prefix))
	// An item key is never empty, so its encoding takes at least two characters.
	if !ok || len(rest) < hashDigits+1+2 || rest[hashDigits] != '/' {
		return reject(RejectShape)
	}
	for _, c := range rest[:hashDigits] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return reject(RejectHash)
		}
	}
	// Sixteen lowercase hex digits always parse.
	hash, _ = strconv.ParseUint(string(rest[:hashDigits]), 16, 64)
	enc, fragment, hasFrag := bytes.Cut(rest[hashDigits+1:], []byte("/"))
	if hasFrag && len(fragment) == 0 {
		return reject(RejectEmptyFragment)
	}
	// Decoding skips newlines and, even strict, accepts several spellings of nothing; only
	// the encoding FormatKey makes is the key's.
	key, derr := b64.DecodeString(string(enc))
	if derr != nil || len(key) == 0 || b64.EncodeToString(key) != string(enc) {
		return reject(RejectKey)
	}
	if keyspace.Hash(key) != hash {
		return reject(RejectHashMismatch)
	}
	return hash, key, string(fragment), nil
}
