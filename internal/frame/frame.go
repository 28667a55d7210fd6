// Package frame lets a gRPC server send messages it encoded earlier. A message that goes to
// many receivers (a quantum to every watcher) or that is assembled from parts encoded when
// they were made (a delta from its operations) is encoded once; the codec sends the bytes as
// they are and encodes everything else as protobuf.
package frame

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // the codec that Codec delegates to
	"google.golang.org/grpc/mem"
)

// Frame is a message already encoded. Its bytes may be shared: they are never modified or
// returned to a pool.
type Frame struct{ Data []byte }

// ServerOption makes a server send Frames as they are.
func ServerOption() grpc.ServerOption {
	return grpc.ForceServerCodecV2(codec{proto: encoding.GetCodecV2("proto")})
}

type codec struct{ proto encoding.CodecV2 }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*Frame); ok {
		return mem.BufferSlice{mem.SliceBuffer(f.Data)}, nil
	}
	return c.proto.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

func (c codec) Name() string { return c.proto.Name() }
