package client

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// memberSlices is how many ranges the member of the member benchmarks holds.
const memberSlices = 500

// benchGranted returns n equal ranges of the key space as primary, every other one.
func benchGranted(n int) []granted {
	var out []granted
	for i, r := range keyspace.Equal(2 * n) {
		if i%2 == 0 {
			out = append(out, granted{r: r, grant: Grant{Role: RolePrimary, Token: 7}})
		}
	}
	return out
}

// BenchmarkMemberRequest is what the member library adds to each request of its service: a
// write run under its key's grant (Member.Write) and its load recorded (RecordLoad), for a
// member holding 500 ranges; beside it, the least an application keeping its own account
// of what it owns would do (a lock and a lookup of the key's range).
func BenchmarkMemberRequest(b *testing.B) {
	m, err := NewMember(MemberConfig{ID: "m1", Address: "m1:1", Assigners: []string{"127.0.0.1:1"}, App: nopApp{}})
	if err != nil {
		b.Fatal(err)
	}
	runs := make([]served, 0, memberSlices)
	for _, g := range benchGranted(memberSlices) {
		runs = append(runs, served{r: g.r, grant: g.grant})
	}
	m.guards.publish(runs, 1)
	keys := make([][]byte, 1024)
	for i := range keys {
		for j := 0; keys[i] == nil; j++ { // a key the member is the primary of
			if k := fmt.Appendf(nil, "key-%d-%d", i, j); m.Serving(k) {
				keys[i] = k
			}
		}
	}
	ctx := context.Background()
	b.Run("member", func(b *testing.B) {
		i := 0
		for b.Loop() {
			k := keys[i%len(keys)]
			if err := m.Write(ctx, k, func(Grant) error { return nil }); err != nil {
				b.Fatal(err)
			}
			m.RecordLoad(k, 1)
			i++
		}
	})
	b.Run("own-account", func(b *testing.B) {
		var mu sync.Mutex
		owned := benchGranted(memberSlices)
		i := 0
		for b.Loop() {
			h := Hash(keys[i%len(keys)])
			mu.Lock()
			_ = ownerOf(owned, h)
			mu.Unlock()
			i++
		}
	})
}

// ownerOf returns the grant of the range of owned holding h: a binary search, as an
// application keeping its own account of its ranges would make.
func ownerOf(owned []granted, h uint64) Grant {
	lo, hi := 0, len(owned)
	for lo < hi {
		mid := (lo + hi) / 2
		if owned[mid].r.End.After(h) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if lo < len(owned) && owned[lo].r.Contains(h) {
		return owned[lo].grant
	}
	return Grant{}
}

// BenchmarkOwnershipStep is the member loop's work per change of what it owns, for a member
// holding 500 ranges: a map that moves one range to it and one away, then each call made and
// answered (setMap, next, done and the view published to requests).
func BenchmarkOwnershipStep(b *testing.B) {
	base := benchGranted(memberSlices)
	moved := append([]granted(nil), base[1:]...) // the first range moves away...
	gap := keyspace.Equal(2 * memberSlices)[1]   // ...and one it lacked comes
	moved = append([]granted{{r: gap, grant: Grant{Role: RolePrimary, Token: 9}}}, moved...)
	o := newOwnership(DefaultConcurrentCalls)
	o.setMap(base, 1, time.Unix(0, 0))
	settle(o)
	g := newGuards()
	now := time.Unix(0, 0)
	gen := uint64(1)
	for b.Loop() {
		gen++
		want := moved
		if gen%2 == 0 {
			want = base
		}
		o.setMap(want, gen, now)
		for _, c := range o.next(now) {
			g.publish(o.serving(), o.gen)
			o.done(c.id, nil, now)
		}
		g.publish(o.serving(), o.gen)
	}
}

// settle makes every call ownership asks for, each answered at once.
func settle(o *ownership) {
	for calls := o.next(time.Unix(0, 0)); len(calls) > 0; calls = o.next(time.Unix(0, 0)) {
		for _, c := range calls {
			o.done(c.id, nil, time.Unix(0, 0))
		}
	}
}

// nopApp is an Application that does nothing.
type nopApp struct{}

func (nopApp) Acquire(context.Context, Range, Grant) error    { return nil }
func (nopApp) Release(context.Context, Range) error           { return nil }
func (nopApp) ChangeRole(context.Context, Range, Grant) error { return nil }
