package e2e_test

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// ownershipLine is what readHandovers reads of a member's JSON log line of a change of
// what it owns (client.LogOwnershipChanged).
type ownershipLine struct {
	Time    time.Time `json:"time"`
	Msg     string    `json:"msg"`
	Node    string    `json:"node"`
	Kind    string    `json:"kind"`
	From    string    `json:"from"`
	To      string    `json:"to"`
	Role    string    `json:"role"`
	Demotes bool      `json:"demotes"`
	Started time.Time `json:"started"`
	Took    int64     `json:"took"` // nanoseconds, as slog's JSON writes a duration
	Guard   int64     `json:"guard"`
	App     int64     `json:"app"`
}

// ownershipEvent is one application call of a member, from its start to its end.
type ownershipEvent struct {
	member     string
	kind, role string
	demotes    bool
	r          keyspace.Range
	start, end time.Time
	// took is the call's time from its start to the member's handling of its answer, of
	// which guard waited for requests in flight and app was the application's.
	took, guard, app time.Duration
}

func (e ownershipEvent) String() string {
	return fmt.Sprintf("%s %s %s %s at %s", e.member, e.kind, e.role, e.r, e.start.Format("15:04:05.000000"))
}

// handovers is what the members' logs say of the primary roles handed over.
type handovers struct {
	// windows are, for each promotion that followed another member's demotion of its
	// points, the time from the demotion's start (the old primary takes no more writes) to
	// the promotion's end (the new one takes them); longest describes the longest few.
	windows []time.Duration
	longest []string
	// releases counts the releases of ranges their member had demoted; early lists those
	// that came before another member had begun to take the role of every point.
	releases int
	early    []string
	// calls is how long each call took, from its start to the member's handling of its
	// answer; own is the library's part of it, without the wait for requests in flight and
	// the application's time.
	calls, own []time.Duration
}

// readHandovers reads the members' logs at paths.
func readHandovers(paths []string) (handovers, error) {
	var events []ownershipEvent
	for _, p := range paths {
		es, err := readOwnership(p)
		if err != nil {
			return handovers{}, err
		}
		events = append(events, es...)
	}
	slices.SortFunc(events, func(a, b ownershipEvent) int { return a.start.Compare(b.start) })
	h := handovers{releases: countReleases(events), early: earlyReleases(events)}
	for _, e := range events {
		h.calls = append(h.calls, e.took)
		h.own = append(h.own, e.took-e.guard-e.app)
	}
	h.windows, h.longest = windows(events)
	return h, nil
}

// readOwnership returns the application calls a member's JSON log records.
func readOwnership(path string) ([]ownershipEvent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []ownershipEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var l ownershipLine
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Kind == "" || !strings.HasPrefix(l.Msg, client.LogOwnershipChanged) {
			continue
		}
		r, err := hexRange(l.From, l.To)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, ownershipEvent{member: l.Node, kind: l.Kind, role: l.Role, demotes: l.Demotes, r: r, start: l.Started, end: l.Time,
			took: time.Duration(l.Took), guard: time.Duration(l.Guard), app: time.Duration(l.App)})
	}
	return out, sc.Err()
}

// hexRange reads a range logged as hexadecimal points ("" to: the end of the space).
func hexRange(from, to string) (keyspace.Range, error) {
	start, err := strconv.ParseUint(from, 16, 64)
	if err != nil {
		return keyspace.Range{}, fmt.Errorf("range start %q: %w", from, err)
	}
	r := keyspace.Range{Start: start, End: keyspace.End}
	if to != "" {
		end, err := strconv.ParseUint(to, 16, 64)
		if err != nil {
			return keyspace.Range{}, fmt.Errorf("range end %q: %w", to, err)
		}
		r.End = keyspace.At(end)
	}
	return r, nil
}

// windows returns, for each promotion that succeeded a demotion, the time from the start of
// the last demotion of its points by another member, within the 30 s before it, to its end,
// and the longest three described. A promotion after another promotion of some of its
// points since that demotion took no role from it: a new token for a primary (a merge).
func windows(events []ownershipEvent) ([]time.Duration, []string) {
	var out []time.Duration
	type pair struct {
		d    time.Duration
		what string
	}
	var all []pair
	for _, p := range events {
		if p.role != client.RolePrimary.String() {
			continue
		}
		var last *ownershipEvent
		for i := range events {
			d := &events[i]
			if d.demotes && d.member != p.member && d.r.Overlaps(p.r) && !d.start.After(p.end) && p.end.Sub(d.start) < 30*time.Second &&
				(last == nil || d.start.After(last.start)) {
				last = d
			}
		}
		if last == nil {
			continue
		}
		between := slices.ContainsFunc(events, func(q ownershipEvent) bool {
			return q.role == p.role && q.r.Overlaps(p.r) && q.start.After(last.start) && q.start.Before(p.start)
		})
		if !between {
			out = append(out, p.end.Sub(last.start))
			all = append(all, pair{p.end.Sub(last.start), fmt.Sprintf("%s after %s", p, last)})
		}
	}
	slices.SortFunc(all, func(a, b pair) int { return cmp.Compare(b.d, a.d) })
	var longest []string
	for _, x := range all[:min(3, len(all))] {
		longest = append(longest, fmt.Sprintf("%s: %s", x.d.Round(time.Millisecond), x.what))
	}
	return out, longest
}

// countReleases counts the releases of points their member had demoted.
func countReleases(events []ownershipEvent) int {
	demoted := map[string]keyspace.Set{}
	n := 0
	for _, e := range events {
		switch {
		case e.kind == "change" && e.demotes:
			demoted[e.member] = demoted[e.member].Union(keyspace.NewSet(e.r))
		case e.kind == "release":
			if !demoted[e.member].Intersect(keyspace.NewSet(e.r)).Empty() {
				n++
			}
			demoted[e.member] = demoted[e.member].Minus(keyspace.NewSet(e.r))
		}
	}
	return n
}

// earlyReleases replays the calls in the order they started and returns the releases of
// points their member had demoted that no other member had begun to take as primary yet.
func earlyReleases(events []ownershipEvent) []string {
	primary, demoted := map[string]keyspace.Set{}, map[string]keyspace.Set{}
	var out []string
	for _, e := range events {
		r := keyspace.NewSet(e.r)
		switch {
		case e.role == client.RolePrimary.String():
			primary[e.member] = primary[e.member].Union(r)
		case e.kind == "change" && e.demotes:
			primary[e.member] = primary[e.member].Minus(r)
			demoted[e.member] = demoted[e.member].Union(r)
		case e.kind == "release":
			var others keyspace.Set
			for m, s := range primary {
				if m != e.member {
					others = others.Union(s)
				}
			}
			if missing := demoted[e.member].Intersect(r).Minus(others); !missing.Empty() {
				out = append(out, fmt.Sprintf("%s, while nobody else had taken %s", e, missing))
			}
			primary[e.member], demoted[e.member] = primary[e.member].Minus(r), demoted[e.member].Minus(r)
		}
	}
	slices.SortFunc(out, cmp.Compare)
	return out
}
