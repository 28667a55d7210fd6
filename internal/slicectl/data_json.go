package slicectl

import (
	"encoding/base64"
	"unicode/utf8"

	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
)

// jsonBytes holds a key or value in JSON: as a string when it is valid UTF-8, which JSON can
// carry unchanged, else as base64 in the field named with _base64.
type jsonBytes struct {
	text, b64 *string
}

func toJSON(b []byte) jsonBytes {
	if utf8.Valid(b) {
		s := string(b)
		return jsonBytes{text: &s}
	}
	s := base64.StdEncoding.EncodeToString(b)
	return jsonBytes{b64: &s}
}

type jsonChange struct {
	Op        string  `json:"op"`
	Key       *string `json:"key,omitempty"`
	KeyBase64 *string `json:"key_base64,omitempty"`
	Hash      string  `json:"hash"`
	Fragment  *string `json:"fragment,omitempty"`
	Clock     uint64  `json:"clock"`
}

type jsonFragment struct {
	ID          string  `json:"id"`
	Value       *string `json:"value,omitempty"`
	ValueBase64 *string `json:"value_base64,omitempty"`
}

type jsonItem struct {
	Key       *string `json:"key,omitempty"`
	KeyBase64 *string `json:"key_base64,omitempty"`
	Hash      string  `json:"hash"`
	// Value and ValueBase64 are both absent when the item has fragments alone.
	Value       *string        `json:"value,omitempty"`
	ValueBase64 *string        `json:"value_base64,omitempty"`
	Fragments   []jsonFragment `json:"fragments"`
}

func changeJSON(op string, key []byte, frag string, hasFrag bool, clock uint64) jsonChange {
	k := toJSON(key)
	c := jsonChange{Op: op, Key: k.text, KeyBase64: k.b64, Hash: keyspace.FormatPoint(keyspace.Hash(key)), Clock: clock}
	if hasFrag {
		c.Fragment = &frag
	}
	return c
}

func itemJSON(it source.Item) jsonItem {
	k := toJSON(it.Key)
	out := jsonItem{KeyBase64: k.b64, Key: k.text, Hash: keyspace.FormatPoint(it.Hash), Fragments: []jsonFragment{}}
	if it.Exists {
		v := toJSON(it.Value)
		out.Value, out.ValueBase64 = v.text, v.b64
	}
	for _, f := range it.Fragments {
		v := toJSON(f.Value)
		out.Fragments = append(out.Fragments, jsonFragment{ID: f.ID, Value: v.text, ValueBase64: v.b64})
	}
	return out
}
