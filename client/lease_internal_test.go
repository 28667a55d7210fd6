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
	ok, _, _ := l.valid(sent)
	assert.True(t, ok, "before the registration: not exclusive")

	l.registered(sent, 2*time.Second, 5)
	ok, until, _ := l.valid(sent)
	assert.True(t, ok)
	assert.Equal(t, sent.Add(1800*time.Millisecond), until, "a tenth of the lease is the default margin")
	ok, _, _ = l.valid(sent.Add(1800 * time.Millisecond))
	assert.False(t, ok, "it ends at the member's count, before the assigner's")

	l.renewed(sent.Add(-time.Second), 2*time.Second, 4) // a reply to an older request, read late
	_, until, _ = l.valid(sent)
	assert.Equal(t, sent.Add(1800*time.Millisecond), until, "an older renewal does not shorten it")
	l.renewed(sent.Add(time.Second), 0, 6) // the assigner withheld the renewal
	_, until, _ = l.valid(sent)
	assert.Equal(t, sent.Add(1800*time.Millisecond), until)

	m := newLease(500 * time.Millisecond)
	m.registered(sent, 2*time.Second, 5)
	_, until, _ = m.valid(sent)
	assert.Equal(t, sent.Add(1500*time.Millisecond), until, "a margin set")

	n := newLease(0)
	n.registered(sent, 0, 5)
	ok, _, _ = n.valid(sent.Add(time.Hour))
	assert.True(t, ok, "a cluster that gives no leases")
}

// A lease that begins covers the roles of the map its grant was made with and later ones: a
// renewal while the lease runs keeps where it began; one after it ended begins anew.
func TestALeaseBeginsAtTheMapOfItsGrant(t *testing.T) {
	sent := time.Now()
	l := newLease(0)
	l.registered(sent, 2*time.Second, 5)
	_, _, gen := l.valid(sent)
	assert.Equal(t, uint64(5), gen)
	l.renewed(sent.Add(time.Second), 2*time.Second, 9)
	_, _, gen = l.valid(sent)
	assert.Equal(t, uint64(5), gen, "renewed while it ran")
	l.renewed(sent.Add(3*time.Second), 2*time.Second, 12) // sent after it ended at +2.8 s
	ok, _, gen := l.valid(sent.Add(3 * time.Second))
	assert.True(t, ok)
	assert.Equal(t, uint64(12), gen, "a lease after a lapse covers the map of its grant on")
	l.registered(sent.Add(4*time.Second), 2*time.Second, 14)
	_, _, gen = l.valid(sent.Add(4 * time.Second))
	assert.Equal(t, uint64(14), gen, "a registration begins a lease")
}
