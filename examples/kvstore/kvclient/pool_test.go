package kvclient_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient/kvclienttest"
)

// fetch reads key "k" through a pool over router, with a client timeout that only Hang
// answers reach.
func fetch(t *testing.T, router kvclient.Router) (kvclient.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := kvclient.NewPool(&http.Client{Timeout: time.Second})
	res, err := pool.Fetch(ctx, router, []byte("k"))
	if r, ok := router.(*kvclienttest.Router); ok {
		_, inFlight := r.Requests()
		assert.Zero(t, inFlight, "every request begun is reported done")
	}
	return res, err
}

func TestFetchAnswersFromThePickedReplica(t *testing.T) {
	a := kvclienttest.NewNode(t, "a", kvclienttest.Value)
	b := kvclienttest.NewNode(t, "b", kvclienttest.Value)
	router := kvclienttest.NewRouter(a, b)
	router.First = 1
	res, err := fetch(t, router)
	require.NoError(t, err)
	assert.Equal(t, kvclienttest.ValueOf("k"), string(res.Value))
	assert.Equal(t, uint64(7), res.Clock)
	assert.Equal(t, kvclient.Result{Value: res.Value, Clock: 7, Served: b.Replica(), Tries: 1}, res)
	assert.Equal(t, 0, a.Requests(), "the policy's pick answered: no other replica is asked")
}

func TestFetchNotFoundIsAnAnswer(t *testing.T) {
	a := kvclienttest.NewNode(t, "a", kvclienttest.NotFound)
	b := kvclienttest.NewNode(t, "b", kvclienttest.Value)
	res, err := fetch(t, kvclienttest.NewRouter(a, b))
	require.ErrorIs(t, err, kvclient.ErrNotFound)
	assert.NotErrorIs(t, err, kvclient.ErrNoAnswer)
	assert.Equal(t, 1, res.Tries)
	assert.Equal(t, 0, b.Requests(), "a node that owns the key answered: not found is not retried")
}

// Each way a replica can fail to answer sends the read to the next replica, which answers;
// the failure is counted by its kind.
func TestFetchTriesTheNextReplicaWhenOneDoesNotAnswer(t *testing.T) {
	for name, c := range map[string]struct {
		answer kvclienttest.Answer
		want   kvclient.Result
	}{
		"misdirected, no owner named": {kvclienttest.NotMine, kvclient.Result{Misdirected: 1}},
		"beyond freshness":            {kvclienttest.Stale, kvclient.Result{Stale: 1}},
		"unavailable":                 {kvclienttest.Unavailable, kvclient.Result{Errors: 1}},
		"server error":                {kvclienttest.Fail, kvclient.Result{Errors: 1}},
		"timeout":                     {kvclienttest.Hang, kvclient.Result{Errors: 1}},
	} {
		t.Run(name, func(t *testing.T) {
			a := kvclienttest.NewNode(t, "a", c.answer)
			b := kvclienttest.NewNode(t, "b", kvclienttest.Value)
			res, err := fetch(t, kvclienttest.NewRouter(a, b))
			require.NoError(t, err)
			c.want.Value, c.want.Clock, c.want.Served, c.want.Tries = res.Value, 7, b.Replica(), 2
			assert.Equal(t, c.want, res)
			assert.Equal(t, 1, a.Requests())
		})
	}
}

func TestFetchFollowsTheOwnersAMisdirectedAnswerNames(t *testing.T) {
	a := kvclienttest.NewNode(t, "a", kvclienttest.NotMine)
	b := kvclienttest.NewNode(t, "b", kvclienttest.Value)
	outside := kvclienttest.NewNode(t, "c", kvclienttest.Value) // not in the router's map yet
	a.SetOwners(outside, a)
	res, err := fetch(t, kvclienttest.NewRouter(a, b))
	require.NoError(t, err)
	assert.Equal(t, outside.Replica().ID, res.Served.ID, "the node's owners are newer than the router's map")
	assert.Equal(t, 2, res.Tries)
	assert.Equal(t, 1, res.Misdirected)
	assert.Equal(t, 0, b.Requests())
	assert.Equal(t, 1, a.Requests(), "a replica is tried once, even when named again")
}

func TestFetchFailsWhenNoReplicaAnswers(t *testing.T) {
	a := kvclienttest.NewNode(t, "a", kvclienttest.Stale)
	b := kvclienttest.NewNode(t, "b", kvclienttest.Stale)
	c := kvclienttest.NewNode(t, "c", kvclienttest.Stale)
	router := kvclienttest.NewRouter(a, b, c)
	router.First = 1
	res, err := fetch(t, router)
	require.ErrorIs(t, err, kvclient.ErrNoAnswer)
	var stale *kvclient.StaleError
	require.ErrorAs(t, err, &stale, "the last failure is wrapped")
	assert.Contains(t, stale.Reason, "no word from the distributor")
	assert.Equal(t, kvclient.Result{Served: c.Replica(), Tries: 3, Stale: 3}, res, "the pick first, then the others in the map's order")
	for _, n := range []*kvclienttest.Node{a, b, c} {
		assert.Equal(t, 1, n.Requests(), n.ID)
	}

	// Every kind of failure at once: still no answer, each counted.
	a.Set(kvclienttest.NotMine)
	b.Set(kvclienttest.Fail)
	down := client.Replica{ID: "d"} // the router knows no address for it yet
	res, err = fetch(t, &kvclienttest.Router{Replicas: append(router.Replicas, down)})
	require.ErrorIs(t, err, kvclient.ErrNoAnswer)
	assert.Equal(t, kvclient.Result{Served: down, Tries: 4, Misdirected: 1, Stale: 1, Errors: 2}, res)
	assert.True(t, errors.Is(err, kvclient.ErrNoAddress), "the last failure: %v", err)
}

func TestFetchBeforeTheFirstMap(t *testing.T) {
	_, err := fetch(t, &kvclienttest.Router{})
	assert.ErrorIs(t, err, client.ErrNotReady)
}

func TestFetchStopsWhenItsContextEnds(t *testing.T) {
	a := kvclienttest.NewNode(t, "a", kvclienttest.Hang)
	b := kvclienttest.NewNode(t, "b", kvclienttest.Value)
	ctx, cancel := context.WithCancel(context.Background())
	router := kvclienttest.NewRouter(a, b)
	go func() {
		<-a.Waiting() // cut the read mid-request
		cancel()
	}()
	res, err := kvclient.NewPool(nil).Fetch(ctx, router, []byte("k"))
	require.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, kvclient.ErrNoAnswer)
	assert.Equal(t, 1, res.Tries)
	assert.Equal(t, 0, b.Requests(), "the read ended with its context")
}

func TestGetTellsStaleFromUnavailable(t *testing.T) {
	n := kvclienttest.NewNode(t, "a", kvclienttest.Stale)
	ctx := context.Background()
	_, _, err := kvclient.New(n.Address(), nil).Get(ctx, []byte("k"))
	var stale *kvclient.StaleError
	require.ErrorAs(t, err, &stale)
	n.Set(kvclienttest.Unavailable)
	_, _, err = kvclient.New(n.Address(), nil).Get(ctx, []byte("k"))
	require.Error(t, err)
	assert.False(t, errors.As(err, &stale), "a 503 for another reason is an error: %v", err)
	assert.Contains(t, err.Error(), "shutting down")
}
