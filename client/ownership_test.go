package client

import (
	"errors"
	"fmt"
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
//	map gen=G         input: "ROLE RANGE" lines (replica, primary, secondary); prints a
//	                  cancel of the call in flight
//	next [+D]         D passes (default none), then the next call, if one is due
//	done [err=E]      the application's answer to the call in flight
//	state             what the application holds, what loads, and what the member reports
//	                  holding as primary
func TestOwnership(t *testing.T) {
	datadriven.Walk(t, "testdata/ownership", func(t *testing.T, path string) {
		o := newOwnership()
		now := time.Unix(0, 0)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			out, err := ownershipStep(t, o, &now, d)
			if err != nil {
				return "error: " + err.Error() + "\n"
			}
			return out
		})
	})
}

func ownershipStep(t *testing.T, o *ownership, now *time.Time, d *datadriven.TestData) (string, error) {
	switch d.Cmd {
	case "map":
		var gen uint64
		d.ScanArgs(t, "gen", &gen)
		want := map[Grant]keyspace.Set{}
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
			want[g] = want[g].Union(keyspace.NewSet(r))
		}
		if o.setMap(want, gen) {
			return "cancel the call in flight\n", nil
		}
		return "ok\n", nil
	case "next":
		if len(d.CmdArgs) > 0 {
			dur, err := time.ParseDuration(strings.TrimPrefix(d.CmdArgs[0].Key, "+"))
			if err != nil {
				return "", err
			}
			*now = now.Add(dur)
		}
		c, ok := o.next(*now)
		if !ok {
			if at, waits := o.wake(); waits {
				return fmt.Sprintf("none; retry at +%s\n", at.Sub(time.Unix(0, 0))), nil
			}
			return "none\n", nil
		}
		return c.String() + "\n", nil
	case "done":
		var err error
		if d.HasArg("err") {
			var msg string
			d.ScanArgs(t, "err", &msg)
			err = errors.New(msg)
		}
		o.done(err, *now)
		return "ok\n", nil
	case "state":
		out := fmt.Sprintf("gen %d\nheld %s\nloading %s\nfailed %s\n", o.gen, o.holding(), o.loading(), o.failed)
		for _, p := range o.primaries() {
			out += fmt.Sprintf("primary %s token %d\n", p.r, p.token)
		}
		return out, nil
	}
	return "", fmt.Errorf("unknown command %q", d.Cmd)
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
