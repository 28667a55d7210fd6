package webview_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/heatmap"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/webview"
)

// fleet is a Backend of n nodes that all serve.
type fleet struct{ nodes []*pb.NodeInfo }

func newFleet(n int) fleet {
	f := fleet{}
	for i := range n {
		f.nodes = append(f.nodes, &pb.NodeInfo{Node: &pb.Node{Id: fmt.Sprintf("n%04d", i), Capacity: 1},
			Labels:  map[string]string{"zone": fmt.Sprintf("z%d", i%3)},
			Address: "127.0.0.1:1", Slices: 150, Load: 0.9 + 0.2*float64(i%7)/7})
	}
	return f
}

func (f fleet) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	return &pb.StatusResponse{Leader: true, LeaderAddress: "127.0.0.1:7070", Slices: 150_000, Nodes: uint32(len(f.nodes)), Imbalance: 1.05}, nil
}

func (f fleet) ListNodes(context.Context, *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	return &pb.ListNodesResponse{Nodes: f.nodes}, nil
}

// BenchmarkAFrameAt150kSlices measures the page in headless Chromium with a full hour of
// history of 150k slices on 1,000 nodes: a frame drawn (rasterized grid to canvas, overlay
// included) and a redraw with its fetch (the assigner rasterizing the grid, the JSON, the
// draw), both as the page times them; and the state's rendering (1,000 nodes' rows). Target:
// a frame in ≤ 200 ms.
func BenchmarkAFrameAt150kSlices(b *testing.B) {
	v, err := webview.New(heatmap.Config{}, newFleet(1000), "zone")
	require.NoError(b, err)
	a := bigMap(b, 150_000, 1000)
	loads := make([]float64, a.Len())
	t0 := time.Now().Add(-time.Hour)
	for c := range heatmap.DefaultColumns {
		hot := float64(c) / heatmap.DefaultColumns // a hot spot that wanders down the space
		for i := range loads {
			d := float64(i)/float64(len(loads)) - hot
			loads[i] = 1 + 50*math.Exp(-d*d*2000)
		}
		v.Record(t0.Add(time.Duration(c)*time.Second), a, loads)
	}
	srv := httptest.NewServer(v.Handler(slog.New(slog.DiscardHandler)))
	b.Cleanup(srv.Close)
	br := newBrowser(b) // closed first: its event stream holds the server's Close up
	require.NoError(b, br.do(b, 60*time.Second, chromedp.Navigate(srv.URL+webview.Path)))
	br.waitFor(b, 60*time.Second, "the first frame", `window.sliceplane && sliceplane.frames > 0`)
	var draw, redraw float64
	for b.Loop() {
		ms := eval[[]float64](b, br, `(async () => { const t = performance.now(); await sliceplane.redraw();
			return [sliceplane.lastFrameMs, performance.now() - t] })()`)
		draw, redraw = draw+ms[0], redraw+ms[1]
	}
	b.ReportMetric(draw/float64(b.N), "ms/frame")
	b.ReportMetric(redraw/float64(b.N), "ms/redraw")
	b.ReportMetric(eval[float64](b, br, `sliceplane.lastStateMs`), "ms/state-1000-nodes")
	b.ReportMetric(eval[float64](b, br, `sliceplane.lastGrid.w * sliceplane.lastGrid.h`), "cells/grid")
	b.ReportMetric(0, "ns/op")
}

// bigMap returns a map of n equal slices, slice i on node i%nodes.
func bigMap(b testing.TB, n, nodes int) *assignment.Assignment {
	ss := make([]assignment.Slice, n)
	for i, r := range keyspace.Equal(n) {
		ss[i] = assignment.Slice{Range: r, Replicas: []assignment.NodeID{assignment.NodeID(fmt.Sprintf("n%04d", i%nodes))}}
	}
	a, err := assignment.New(1, ss)
	require.NoError(b, err)
	return a
}
