package client

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

func TestARouterWatchesItsBestRelayThatDidNotFailLately(t *testing.T) {
	var dialled []string
	rs := newRelays("router-1", func(addr string) (*grpc.ClientConn, error) {
		dialled = append(dialled, addr)
		return dial.Peer(addr)
	})
	defer rs.close()
	now := time.Now()
	assert.Empty(t, rs.preferred(now), "no relay known: the assigner")

	set := quantum.Distributors{"d1": "127.0.0.1:1", "d2": "127.0.0.1:2", "d3": "127.0.0.1:3"}
	rs.update(set)
	ranked := set.Rank("router-1")
	require.Equal(t, ranked[0], rs.preferred(now))
	_, err := rs.conn(ranked[0])
	require.NoError(t, err)
	rs.jitter = func(d time.Duration) time.Duration { return d / 2 }
	rs.watching(ranked[0], now)
	rs.tick(now.Add(warmSpread/2 - time.Millisecond))
	assert.Equal(t, []string{set[ranked[0]]}, dialled, "the next relay is connected at a random point of warmSpread, not at once")
	rs.tick(now.Add(warmSpread / 2))
	assert.Equal(t, []string{set[ranked[0]], set[ranked[1]]}, dialled, "the next relay is connected ahead of need")
	rs.tick(now.Add(warmSpread))
	assert.Len(t, dialled, 2, "and once")

	rs.fail(ranked[0], now)
	assert.Equal(t, ranked[1], rs.preferred(now), "a failed relay is left alone")
	rs.fail(ranked[1], now)
	rs.fail(ranked[2], now)
	assert.Empty(t, rs.preferred(now), "every relay failed lately: the assigner")
	assert.Equal(t, ranked[0], rs.preferred(now.Add(relayRetry+time.Second)), "and the best one again once its time is out")

	// A relay that moved is dialled again at its new address; one that left is forgotten.
	// A new set is news: the relays that failed are tried again.
	moved := quantum.Distributors{ranked[0]: "127.0.0.1:9", ranked[1]: set[ranked[1]]}
	rs.update(moved)
	assert.Equal(t, ranked[0], rs.preferred(now), "the set changed: its best relay is tried again")
	_, ok := rs.conns[ranked[0]]
	assert.False(t, ok, "the moved relay's connection is closed")
	assert.Contains(t, rs.conns, ranked[1])
	_, err = rs.conn(ranked[0])
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:9", dialled[len(dialled)-1])
}
