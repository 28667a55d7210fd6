package frame

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newCodec() codec { return codec{proto: encoding.GetCodecV2("proto")} }

func TestAFrameIsSentAsItIs(t *testing.T) {
	data := []byte{0x08, 0x01, 0xff, 0x00, 0x42} // any bytes: the codec does not look at them
	orig := bytes.Clone(data)
	out, err := newCodec().Marshal(&Frame{Data: data})
	require.NoError(t, err)
	require.Len(t, out, 1)
	assert.Equal(t, orig, out.Materialize())
	assert.Same(t, &data[0], &out[0].ReadOnlyData()[0], "the bytes are not copied")
	out.Free()
	assert.Equal(t, orig, data, "freeing the sent buffers leaves the frame's bytes alone")
}

func TestOtherMessagesAreProtobuf(t *testing.T) {
	c := newCodec()
	assert.Equal(t, "proto", c.Name(), "clients need no codec of their own")
	msg := &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}
	out, err := c.Marshal(msg)
	require.NoError(t, err)
	want, err := proto.Marshal(msg)
	require.NoError(t, err)
	assert.Equal(t, want, out.Materialize())

	var back healthpb.HealthCheckResponse
	require.NoError(t, c.Unmarshal(out, &back))
	assert.True(t, proto.Equal(msg, &back))
	out.Free()

	_, err = c.Marshal(struct{}{})
	assert.Error(t, err, "neither a frame nor a protobuf message")
}

// health streams one response pre-encoded as a Frame and one as a message, and answers
// Check normally: a server with the option mixes both.
type health struct {
	healthpb.UnimplementedHealthServer
	frame *Frame
}

func (h *health) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}, nil
}

func (h *health) Watch(_ *healthpb.HealthCheckRequest, s grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	if err := s.SendMsg(h.frame); err != nil {
		return err
	}
	return s.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVICE_UNKNOWN})
}

func TestAServerSendsFramesAndMessages(t *testing.T) {
	data, err := proto.Marshal(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
	require.NoError(t, err)
	orig := bytes.Clone(data)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := grpc.NewServer(ServerOption())
	healthpb.RegisterHealthServer(s, &health{frame: &Frame{Data: data}})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(lis)
	}()
	defer func() {
		s.Stop()
		<-done
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	c := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	resp, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: "x"})
	require.NoError(t, err, "requests are decoded and responses encoded as protobuf")
	assert.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, resp.GetStatus())

	// The same frame goes to several streams, as a quantum goes to every watcher.
	for range 3 {
		w, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		got, err := w.Recv()
		require.NoError(t, err)
		assert.Equal(t, healthpb.HealthCheckResponse_SERVING, got.GetStatus(), "the frame arrives as the message it encodes")
		got, err = w.Recv()
		require.NoError(t, err)
		assert.Equal(t, healthpb.HealthCheckResponse_SERVICE_UNKNOWN, got.GetStatus())
	}
	assert.Equal(t, orig, data, "sending never changes a frame's bytes")
}
