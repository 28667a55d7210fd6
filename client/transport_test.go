package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
)

// TestTransportRoutesByKey runs two members with roles, each serving HTTP, and a client whose
// Transport takes the key from the path: a write goes to the key's primary, a read to a
// replica, a 421 answer is tried again (the body sent again), and a request without a key
// fails without being sent.
func TestTransportRoutesByKey(t *testing.T) {
	refuse, addrs := map[string]*atomic.Int32{}, map[string]string{}
	for _, id := range []string{"m1", "m2"} {
		n := new(atomic.Int32)
		refuse[id] = n
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			if n.Add(-1) >= 0 {
				http.Error(w, "not mine", http.StatusMisdirectedRequest)
				return
			}
			io.WriteString(w, id+" "+string(body)) //nolint:errcheck // the test reads it
		}))
		t.Cleanup(srv.Close)
		addrs[id] = strings.TrimPrefix(srv.URL, "http://")
	}
	_, r := roleCluster(t, addrs, client.RoundRobin)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	hc := &http.Client{Transport: &client.Transport{Router: r, Key: func(req *http.Request) ([]byte, bool, error) {
		key := strings.TrimPrefix(req.URL.Path, "/v1/")
		if key == req.URL.Path || key == "" {
			return nil, false, errors.New("the path names no key")
		}
		return []byte(key), req.Method == http.MethodPost, nil
	}}}
	send := func(method, key, body string) (string, error) {
		req, err := http.NewRequestWithContext(ctx, method, "http://counter/v1/"+key, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := hc.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	for i := range 20 {
		key := string(rune('a'+i)) + "-key"
		got, err := send(http.MethodPost, key, "incr")
		require.NoError(t, err)
		p, err := r.Primary([]byte(key))
		require.NoError(t, err)
		assert.Equal(t, p.ID+" incr", got, "a write goes to the key's primary")
		got, err = send(http.MethodGet, key, "")
		require.NoError(t, err)
		rt, err := r.Lookup([]byte(key))
		require.NoError(t, err)
		assert.Contains(t, []string{rt.Replicas[0].ID + " ", rt.Replicas[len(rt.Replicas)-1].ID + " "}, got, "a read goes to a replica")
	}

	p, err := r.Primary([]byte("moved"))
	require.NoError(t, err)
	refuse[p.ID].Store(2)
	got, err := send(http.MethodPost, "moved", "again")
	require.NoError(t, err)
	assert.Equal(t, p.ID+" again", got, "tried again, with its body")

	_, err = send(http.MethodGet, "", "")
	require.ErrorIs(t, err, client.ErrNoKey)
}
