package slicectl

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

func TestQuarantinedRangesAreShownWithTheNodesThatCrashed(t *testing.T) {
	qs := []*pb.Quarantine{{Range: &pb.Range{Start: 0x4000000000000000, End: 0x8000000000000000},
		Since: timestamppb.New(time.Now().Add(-time.Minute)), Nodes: []string{"n5", "n2"}}}
	var b bytes.Buffer
	w := newTable(&b)
	printQuarantined(w, qs)
	assert.NoError(t, w.Flush())
	assert.Regexp(t, `^quarantined\s+\[0x4000000000000000, 0x8000000000000000\) since .* nodes n5,n2 crashed after acquiring it; held by no node`, b.String())
	got := quarantinesJSON(qs)
	assert.Equal(t, []string{"n5", "n2"}, got[0].Nodes)
	assert.Equal(t, "0x4000000000000000", got[0].Range.Start)
	assert.Empty(t, quarantinesJSON(nil))
	assert.NotNil(t, quarantinesJSON(nil), "JSON lists none as [], not null")
}
