package client

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// TestOwnership runs the scripts in testdata/ownership: a member's ranges of successive maps
// stepped into ownership, and the calls it asks of the application. Regenerate with
//
//	go test ./client -run TestOwnership -rewrite
//
// Commands (points are two hex digits, the top byte of the hash: 40-80 is [0x40.., 0x80..),
// c0-end runs to the end of the space):
//
//	limit n=N         start over with an ownership that makes at most N calls at once
//	                  (each script starts with 1)
//	map gen=G         input: "ROLE RANGE" lines (replica, primary[:TOKEN], secondary); prints
//	                  the calls in flight it cancels (a new generation brings a failed call
//	                  forward to the least backoff)
//	next [+D]         D passes (default none), then the calls due, each "#ID call"
//	done [call=ID] [err=E]
//	                  the application's answer to call ID (default: the only one in flight)
//	state             what the application holds, loads and serves, what failed, and what the
//	                  member reports holding as primary
func TestOwnership(t *testing.T) {
	datadriven.Walk(t, "testdata/ownership", func(t *testing.T, path string) {
		o := newOwnership(1)
		now := time.Unix(0, 0)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			out, err := ownershipStep(t, &o, &now, d)
			if err != nil {
				return "error: " + err.Error() + "\n"
			}
			return out
		})
	})
}

func ownershipStep(t *testing.T, o **ownership, now *time.Time, d *datadriven.TestData) (string, error) {
	switch d.Cmd {
	case "limit":
		var n int
		d.ScanArgs(t, "n", &n)
		*o = newOwnership(n)
		return "ok\n", nil
	case "map":
		return mapStep(t, *o, *now, d)
	case "next":
		if len(d.CmdArgs) > 0 {
			dur, err := time.ParseDuration(strings.TrimPrefix(d.CmdArgs[0].Key, "+"))
			if err != nil {
				return "", err
			}
			*now = now.Add(dur)
		}
		calls := (*o).next(*now)
		if len(calls) == 0 {
			if at, waits := (*o).wake(); waits {
				return fmt.Sprintf("none; retry at +%s\n", at.Sub(time.Unix(0, 0))), nil
			}
			return "none\n", nil
		}
		var out strings.Builder
		for _, c := range calls {
			fmt.Fprintf(&out, "#%d %s\n", c.id, c)
		}
		return out.String(), nil
	case "done":
		return doneStep(t, *o, *now, d)
	case "state":
		return ownershipState(*o), nil
	}
	return "", fmt.Errorf("unknown command %q", d.Cmd)
}

// mapStep steps a map in: its input lines, sorted, each point once.
func mapStep(t *testing.T, o *ownership, now time.Time, d *datadriven.TestData) (string, error) {
	var gen uint64
	d.ScanArgs(t, "gen", &gen)
	var want []granted
	for line := range strings.Lines(d.Input) {
		f := strings.Fields(line)
		roles := map[string]Role{"replica": RoleReplica, "primary": RolePrimary, "secondary": RoleSecondary}
		name, token, _ := strings.Cut(f[0], ":") // primary:TOKEN
		g := Grant{Role: roles[name]}
		if token != "" {
			var err error
			if g.Token, err = strconv.ParseUint(token, 10, 64); err != nil {
				return "", err
			}
		}
		if len(f) != 2 || g.Role == 0 {
			return "", fmt.Errorf("want \"replica|primary[:TOKEN]|secondary RANGE\", got %q", line)
		}
		r, err := parseTestRange(f[1])
		if err != nil {
			return "", err
		}
		want = append(want, granted{r: r, grant: g})
	}
	slices.SortFunc(want, func(a, b granted) int { return cmp.Compare(a.r.Start, b.r.Start) })
	cancel := o.setMap(want, gen, now)
	if len(cancel) == 0 {
		return "ok\n", nil
	}
	var out strings.Builder
	for _, id := range cancel {
		fmt.Fprintf(&out, "cancel #%d\n", id)
	}
	return out.String(), nil
}

// doneStep answers a call in flight.
func doneStep(t *testing.T, o *ownership, now time.Time, d *datadriven.TestData) (string, error) {
	var err error
	if d.HasArg("err") {
		var msg string
		d.ScanArgs(t, "err", &msg)
		err = errors.New(msg)
	}
	var id uint64
	switch {
	case d.HasArg("call"):
		d.ScanArgs(t, "call", &id)
	case len(o.calls) == 1:
		for id = range o.calls {
		}
	default:
		return "", fmt.Errorf("%d calls in flight: say which (call=ID)", len(o.calls))
	}
	if o.calls[id] == nil {
		return "", fmt.Errorf("no call #%d in flight", id)
	}
	o.done(id, err, now)
	return "ok\n", nil
}

// ownershipState prints what ownership holds, loads, serves and reports.
func ownershipState(o *ownership) string {
	set := func(rs []keyspace.Range) keyspace.Set { return keyspace.NewSet(rs...) }
	out := fmt.Sprintf("gen %d\nheld %s\nloading %s\nfailed %s\n", o.gen, set(o.holding()), set(o.loading()), set(o.failed()))
	for _, g := range o.serving() {
		switch {
		case g.grant.Role == 0:
			out += fmt.Sprintf("serves %s as nothing yet, next %s\n", g.r, g.next)
		case g.next.Role != 0:
			out += fmt.Sprintf("serves %s as %s, next %s\n", g.r, g.grant, g.next)
		default:
			out += fmt.Sprintf("serves %s as %s\n", g.r, g.grant)
		}
	}
	for _, p := range o.primaries() {
		out += fmt.Sprintf("primary %s token %d\n", p.r, p.token)
	}
	return out
}

// parseTestRange reads "40-80" or "c0-end".
func parseTestRange(s string) (keyspace.Range, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return keyspace.Range{}, fmt.Errorf("range %q: want AA-BB", s)
	}
	start, err := strconv.ParseUint(a, 16, 8)
	if err != nil {
		return keyspace.Range{}, err
	}
	r := keyspace.Range{Start: start << 56, End: keyspace.End}
	if b != "end" {
		end, err := strconv.ParseUint(b, 16, 8)
		if err != nil {
			return keyspace.Range{}, err
		}
		r.End = keyspace.At(end << 56)
	}
	return r, nil
}

// failed returns the points whose last acquire or promotion failed, for the scripts.
func (o *ownership) failed() []keyspace.Range {
	return o.ranges(func(s seg) bool { return !s.retryAt.IsZero() })
}
