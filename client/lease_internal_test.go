package client

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A lease counts from when the request was sent, less the margin; a late reply or a renewal
// that would shorten it changes nothing; a cluster that is not exclusive always leases.
func TestLeaseCountsFromTheRequest(t *testing.T) {
	sent := time.Now()
	l := newLease(0)
	ok, _ := l.valid(sent)
	assert.True(t, ok, "before the registration: not exclusive")

	l.registered(sent, 2*time.Second)
	ok, until := l.valid(sent)
	assert.True(t, ok)
	assert.Equal(t, sent.Add(1800*time.Millisecond), until, "a tenth of the lease is the default margin")
	ok, _ = l.valid(sent.Add(1800 * time.Millisecond))
	assert.False(t, ok, "it ends at the member's count, before the assigner's")

	l.renewed(sent.Add(-time.Second), 2*time.Second) // a reply to an older request, read late
	_, until = l.valid(sent)
	assert.Equal(t, sent.Add(1800*time.Millisecond), until, "an older renewal does not shorten it")
	l.renewed(sent.Add(time.Second), 0) // the assigner withheld the renewal
	_, until = l.valid(sent)
	assert.Equal(t, sent.Add(1800*time.Millisecond), until)

	m := newLease(500 * time.Millisecond)
	m.registered(sent, 2*time.Second)
	_, until = m.valid(sent)
	assert.Equal(t, sent.Add(1500*time.Millisecond), until, "a margin set")

	n := newLease(0)
	n.registered(sent, 0)
	ok, _ = n.valid(sent.Add(time.Hour))
	assert.True(t, ok, "a cluster that gives no leases")
}
