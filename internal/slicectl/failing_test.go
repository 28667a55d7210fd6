package slicectl

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

// TestJSONNeverFailsOnNonFiniteNumbers: a NaN or infinite measure is written as protobuf's
// JSON mapping writes it, instead of failing the command ("unsupported value: +Inf").
func TestJSONNeverFailsOnNonFiniteNumbers(t *testing.T) {
	full := &pb.Range{EndOfSpace: true}
	sl := jsonSlices{Total: 2, Slices: []jsonSlice{
		{jsonRange: rangeJSON(full), Replicas: []string{"a"}, Load: jsonFloat(math.Inf(1)), Keys: jsonFloat(math.NaN())},
		{jsonRange: rangeJSON(full), Replicas: []string{"b"}, Load: jsonFloat(math.Inf(-1)), Keys: 3},
	}}
	for _, format := range []string{"json", "yaml"} {
		var out bytes.Buffer
		require.NoError(t, newPrinter(&out, format).print(sl), format)
		assert.Contains(t, out.String(), "Infinity", format)
		assert.Contains(t, out.String(), "-Infinity", format)
		assert.Contains(t, out.String(), "NaN", format)
	}
	var out bytes.Buffer
	require.NoError(t, newPrinter(&out, "json").print(statusJSON(&pb.StatusResponse{Imbalance: math.NaN()})))
	var st struct{ Imbalance any }
	require.NoError(t, json.Unmarshal(out.Bytes(), &st))
	assert.Equal(t, "NaN", st.Imbalance)
	b, err := json.Marshal(jsonFloat(1.5))
	require.NoError(t, err)
	assert.Equal(t, "1.5", string(b), "finite numbers stay numbers")
}

func TestStatusAndExplainSayPassesFail(t *testing.T) {
	at := timestamppb.New(time.Now().Add(-2 * time.Second))
	st := &pb.StatusResponse{Leader: true, LeaderAddress: "x:1", PassFailures: 3, PassError: "balance: it broke", PassErrorTime: at}
	var out bytes.Buffer
	s := &session{out: newPrinter(&out, "table")}
	require.NoError(t, printStatus(s, st))
	assert.Regexp(t, `(?m)^balancing\s+FAILING: 3 passes in a row, the last .* ago\): balance: it broke`, out.String())

	out.Reset()
	x := &pb.ExplainResponse{Passed: false, PassFailures: 3, PassError: "balance: it broke", PassErrorTime: at}
	require.NoError(t, printExplain(s, x, st))
	assert.Contains(t, out.String(), "balancing passes are FAILING: 3 passes in a row")

	j, err := json.Marshal(statusJSON(st))
	require.NoError(t, err)
	assert.Contains(t, string(j), `"pass_failures":3,"pass_error":"balance: it broke","pass_error_time":`)
	j, err = json.Marshal(explainJSON(x, false))
	require.NoError(t, err)
	assert.Contains(t, string(j), `"pass_failures":3`)

	out.Reset()
	require.NoError(t, printStatus(s, &pb.StatusResponse{Leader: true}))
	assert.Regexp(t, `(?m)^balancing\s+running$`, out.String())
}

// stuckAdmin is an assigner whose passes fail, so a drain never progresses.
type stuckAdmin struct {
	pb.AdminServiceClient
}

func (stuckAdmin) Drain(context.Context, *pb.DrainRequest, ...grpc.CallOption) (*pb.DrainResponse, error) {
	return &pb.DrainResponse{Slices: 5}, nil
}

func (stuckAdmin) Status(context.Context, *pb.StatusRequest, ...grpc.CallOption) (*pb.StatusResponse, error) {
	return &pb.StatusResponse{Leader: true, PassFailures: 2, PassError: "balance: it broke"}, nil
}

func (stuckAdmin) ListNodes(context.Context, *pb.ListNodesRequest, ...grpc.CallOption) (*pb.ListNodesResponse, error) {
	return &pb.ListNodesResponse{Nodes: []*pb.NodeInfo{{Node: &pb.Node{Id: "n1"}, Slices: 5, Draining: true}}}, nil
}

// TestDrainSaysWhenPassesFail: a drain that cannot progress because passes fail says so at
// once, and its timeout says why.
func TestDrainSaysWhenPassesFail(t *testing.T) {
	var out, errOut bytes.Buffer
	s := &session{g: &globalOptions{timeout: time.Second}, admin: stuckAdmin{}, out: newPrinter(&out, "table"), errOut: &errOut, parent: t.Context()}
	o := &drainOptions{waitTimeout: 300 * time.Millisecond, interval: 10 * time.Millisecond}
	err := o.run(t.Context(), s, "n1")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "balancing passes are failing: balance: it broke")
	assert.Contains(t, errOut.String(), "balancing passes are failing (2 in a row): the drain of n1 makes no progress")
	assert.Equal(t, 1, bytes.Count(errOut.Bytes(), []byte("are failing")), "said once per cause: %s", errOut.String())
}
