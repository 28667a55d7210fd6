package sim

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

var twoNodes = []assignment.NodeID{"n0", "n1"}

func TestReadTrace(t *testing.T) {
	tr, err := ReadTrace(strings.NewReader(`
{"epoch":0,"key":"a","load":2}
{"epoch":0,"key":"b","load":0}

{"epoch":1,"add_node":"big","capacity":2.5}
{"epoch":2,"delete_key":"a"}
{"epoch":2,"remove_node":"n0"}
{"epoch":3,"add_node":"small","labels":{"zone":"b"}}
`), twoNodes)
	require.NoError(t, err)
	assert.Equal(t, 3, tr.LastEpoch)
	assert.False(t, tr.NodesAtStart)
	assert.Equal(t, []Event{
		{Epoch: 0, Line: 2, Kind: SetLoad, Name: "a", Value: 2},
		{Epoch: 0, Line: 3, Kind: SetLoad, Name: "b", Value: 0},
		{Epoch: 1, Line: 5, Kind: AddNode, Name: "big", Value: 2.5},
		{Epoch: 2, Line: 6, Kind: DeleteKey, Name: "a"},
		{Epoch: 2, Line: 7, Kind: RemoveNode, Name: "n0"},
		{Epoch: 3, Line: 8, Kind: AddNode, Name: "small", Value: 1, Labels: map[string]string{"zone": "b"}},
	}, tr.Events)

	tr, err = ReadTrace(strings.NewReader(`{"epoch":0,"add_node":"x"}`), twoNodes)
	require.NoError(t, err)
	assert.True(t, tr.NodesAtStart, "nodes added at epoch 0 replace --nodes")
}

func TestReadTraceRejectsMalformedLines(t *testing.T) {
	ok := `{"epoch":0,"key":"a","load":1}` + "\n"
	cases := []struct {
		line, want string
	}{
		{`{"epoch":0,"key":"a","load":1`, "not a JSON event"},
		{`[1,2]`, "not a JSON event"},
		{`{"epoch":0,"key":"a","load":1} {"epoch":1}`, "more than one JSON value"},
		{`{"epoch":0,"key":"a","lod":1}`, `unknown field "lod"`},
		{`{"key":"a","load":1}`, `missing "epoch"`},
		{`{"epoch":-1,"key":"a","load":1}`, "epoch -1 is out of range"},
		{`{"epoch":9223372036854775807,"key":"a","load":1}`, "epoch 9223372036854775807 is out of range"},
		{`{"epoch":1.5,"key":"a","load":1}`, "not a JSON event"},
		{`{"epoch":0}`, "no action"},
		{`{"epoch":0,"key":"a","load":1,"delete_key":"b"}`, "several actions"},
		{`{"epoch":0,"key":"a"}`, `key "a" has no "load"`},
		{`{"epoch":0,"key":"a","load":-3}`, `key "a" has load -3`},
		{`{"epoch":0,"key":"a","load":1e400}`, "not a JSON event"},
		{`{"epoch":0,"key":"a","load":1,"capacity":2}`, `"capacity" goes with "add_node"`},
		{`{"epoch":0,"remove_node":"n0","labels":{"zone":"a"}}`, `"labels" goes with "add_node"`},
		{`{"epoch":0,"delete_key":"a","load":2}`, `"load" goes with "key"`},
		{`{"epoch":0,"add_node":"x","capacity":0}`, `node "x" has capacity 0`},
		{`{"epoch":0,"add_node":"x y"}`, "bad node ID"},
		{`{"epoch":0,"remove_node":""}`, "bad node ID"},
		{`{"epoch":0,"delete_key":"zz"}`, `key "zz" is deleted but does not exist`},
		{`{"epoch":0,"add_node":"n1"}`, "" /* epoch-0 adds replace --nodes: n1 is new */},
		{`{"epoch":1,"add_node":"n1"}`, `node "n1" is added but already exists`},
		{`{"epoch":1,"remove_node":"n7"}`, `node "n7" is removed but does not exist`},
	}
	for _, c := range cases {
		_, err := ReadTrace(strings.NewReader(ok+c.line+"\n"), twoNodes)
		if c.want == "" {
			assert.NoError(t, err, c.line)
			continue
		}
		require.ErrorIs(t, err, ErrTrace, c.line)
		assert.Contains(t, err.Error(), "line 2: ", c.line)
		assert.Contains(t, err.Error(), c.want, c.line)
	}

	_, err := ReadTrace(strings.NewReader(`{"epoch":3,"key":"a","load":1}`+"\n"+`{"epoch":2,"key":"b","load":1}`), twoNodes)
	require.ErrorIs(t, err, ErrTrace)
	assert.Contains(t, err.Error(), "line 2: epoch 2 comes after epoch 3")
}
