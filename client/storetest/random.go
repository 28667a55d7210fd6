package storetest

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"

	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
)

// model is the state a store should hold, kept the plainest way. Its slices are whole parts
// of randParts, which keeps its own slice arithmetic trivial; the fiddly cases of slices are
// tested one by one.
type model struct {
	cursor client.Cursor
	held   []bool // by part of randParts
	items  map[string]*modelItem
}

type modelItem struct {
	value    []byte
	hasValue bool
	frags    map[string][]byte
}

var randParts = equalParts(8)

func newModel() *model {
	return &model{held: make([]bool, len(randParts)), items: map[string]*modelItem{}}
}

func (m *model) clone() *model {
	c := &model{cursor: m.cursor, held: slices.Clone(m.held), items: make(map[string]*modelItem, len(m.items))}
	for k, it := range m.items {
		c.items[k] = &modelItem{value: it.value, hasValue: it.hasValue, frags: maps.Clone(it.frags)}
	}
	return c
}

func (m *model) apply(op client.Op) {
	k := string(op.Key)
	switch op.Kind {
	case client.OpReset:
		clear(m.held)
		clear(m.items)
	case client.OpAddSlice:
		m.held[slices.Index(randParts, op.Range)] = true
	case client.OpDropSlice:
		m.held[slices.Index(randParts, op.Range)] = false
		for k := range m.items {
			if op.Range.Contains(client.Hash([]byte(k))) {
				delete(m.items, k)
			}
		}
	case client.OpPut:
		it := m.item(k)
		it.value, it.hasValue = op.Value, true
	case client.OpDelete:
		delete(m.items, k)
	case client.OpPutFragment:
		m.item(k).frags[op.Fragment] = op.Value
	case client.OpDeleteFragment:
		if it := m.items[k]; it != nil {
			delete(it.frags, op.Fragment)
			if !it.hasValue && len(it.frags) == 0 {
				delete(m.items, k)
			}
		}
	}
}

func (m *model) item(k string) *modelItem {
	it := m.items[k]
	if it == nil {
		it = &modelItem{frags: map[string][]byte{}}
		m.items[k] = it
	}
	return it
}

func (m *model) state() state {
	st := state{Cursor: m.cursor, Items: map[string]client.Item{}}
	for i, h := range m.held {
		if h {
			st.Slices = append(st.Slices, randParts[i])
		}
	}
	for k, it := range m.items {
		ci := client.Item{Key: []byte(k), Value: it.value, HasValue: it.hasValue}
		for id, v := range it.frags {
			ci.Fragments = append(ci.Fragments, client.Fragment{ID: id, Value: v})
		}
		st.Items[k] = norm(ci)
	}
	return st
}

// randOp returns an operation that is valid on m.
func randOp(r *rand.Rand, m *model) client.Op {
	key := fmt.Appendf(nil, "r%d", r.IntN(64))
	id := []string{"a", "b", "c", "\x00"}[r.IntN(4)]
	value := bytes.Repeat([]byte{byte('a' + r.IntN(26))}, r.IntN(4))
	switch n := r.IntN(100); {
	case n < 30:
		return client.Op{Kind: client.OpPut, Key: key, Value: value}
	case n < 40:
		return client.Op{Kind: client.OpDelete, Key: key}
	case n < 65:
		return client.Op{Kind: client.OpPutFragment, Key: key, Fragment: id, Value: value}
	case n < 80:
		return client.Op{Kind: client.OpDeleteFragment, Key: key, Fragment: id}
	case n < 98:
		p := r.IntN(len(randParts))
		if m.held[p] || r.IntN(3) == 0 {
			return client.Op{Kind: client.OpDropSlice, Range: randParts[p]}
		}
		return client.Op{Kind: client.OpAddSlice, Range: randParts[p]}
	}
	return client.Op{Kind: client.OpReset}
}

// testRandom applies random batches, some of them aborted, and compares the store with the
// model after each.
func testRandom(e *env) {
	r := rand.New(rand.NewPCG(1, 2))
	m := newModel()
	for i := range 150 {
		next := m.clone()
		b := e.begin()
		for range 1 + r.IntN(12) {
			op := randOp(r, next)
			next.apply(op)
			var err error
			switch op.Kind {
			case client.OpReset:
				err = b.Reset()
			case client.OpAddSlice:
				err = b.AddSlice(op.Range)
			case client.OpDropSlice:
				err = b.DropSlice(op.Range)
			case client.OpPut:
				err = b.Put(op.Key, op.Value)
			case client.OpDelete:
				err = b.Delete(op.Key)
			case client.OpPutFragment:
				err = b.PutFragment(op.Key, op.Fragment, op.Value)
			case client.OpDeleteFragment:
				err = b.DeleteFragment(op.Key, op.Fragment)
			}
			require.NoError(e.t, err, "batch %d: %s", i, op.Kind)
		}
		if r.IntN(5) == 0 {
			b.Abort()
		} else {
			next.cursor = client.Cursor{Epoch: 1, Index: uint64(i)}
			require.NoError(e.t, b.Commit(next.cursor))
			m = next
		}
		if e.durable && i%30 == 29 {
			e.doReopen()
		}
		require.Equal(e.t, m.state(), e.dump(), "after batch %d", i)
	}
}
