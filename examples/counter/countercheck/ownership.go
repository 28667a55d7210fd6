package countercheck

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/examples/counter/countermember"
)

// Window is a time during which a member's application held a range of points as primary,
// within its lease: [From, Until). Until is far in the future for a window still open when
// its log ends.
type Window struct {
	Member      string
	Start, End  uint64 // the range's points, [Start, End]: End is its last point
	Token       uint64
	From, Until time.Time
}

func (w Window) String() string {
	return fmt.Sprintf("%s [%016x, %016x] token %d from %s until %s", w.Member, w.Start, w.End, w.Token,
		w.From.Format("15:04:05.000"), w.Until.Format("15:04:05.000"))
}

// logLine is what Ownership reads of a JSON log line.
type logLine struct {
	Time  time.Time `json:"time"`
	Msg   string    `json:"msg"`
	Start string    `json:"start"`
	End   string    `json:"end"`
	Token uint64    `json:"token"`
	Ended time.Time `json:"ended"`
}

// Windows reads member's JSON log and returns the windows in which its application held
// ranges as primary (countermember.LogPrimaryFrom and LogPrimaryUntil, client.LogLeaseEnded): from a "primary from" to the "primary until" of the same points, or to
// the end of the member's lease that its log says ended first.
func Windows(member string, log io.Reader) ([]Window, error) {
	var open, closed []Window
	sc := bufio.NewScanner(log)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue // not a JSON line: a panic's trace, which the suite reports on its own
		}
		switch l.Msg {
		case countermember.LogPrimaryFrom:
			w, err := window(member, l)
			if err != nil {
				return nil, err
			}
			open = append(open, w)
		case countermember.LogPrimaryUntil:
			w, err := window(member, l)
			if err != nil {
				return nil, err
			}
			var rest []Window
			for _, o := range open {
				done, left := cut(o, w.Start, w.End)
				for _, d := range done {
					d.Until = l.Time
					closed = append(closed, d)
				}
				rest = append(rest, left...)
			}
			open = rest
		case client.LogLeaseEnded:
			for _, o := range open {
				o.Until = later(o.From, l.Ended)
				closed = append(closed, o)
			}
			open = nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("countercheck: reading %s's log: %w", member, err)
	}
	for _, o := range open {
		o.Until = time.Unix(math.MaxInt32, 0)
		closed = append(closed, o)
	}
	return closed, nil
}

// window returns the window a "primary from" or "primary until" line names, from its time.
func window(member string, l logLine) (Window, error) {
	start, err := strconv.ParseUint(l.Start, 16, 64)
	if err != nil {
		return Window{}, fmt.Errorf("countercheck: %s's log: start %q: %w", member, l.Start, err)
	}
	end := uint64(math.MaxUint64)
	if l.End != "" {
		e, err := strconv.ParseUint(l.End, 16, 64)
		if err != nil || e == 0 {
			return Window{}, fmt.Errorf("countercheck: %s's log: end %q: %v", member, l.End, err)
		}
		end = e - 1
	}
	return Window{Member: member, Start: start, End: end, Token: l.Token, From: l.Time}, nil
}

// cut splits w by the points [start, end]: the parts inside, and those outside.
func cut(w Window, start, end uint64) (inside, outside []Window) {
	if w.End < start || w.Start > end {
		return nil, []Window{w}
	}
	in := w
	in.Start, in.End = max(w.Start, start), min(w.End, end)
	if w.Start < start {
		left := w
		left.End = start - 1
		outside = append(outside, left)
	}
	if w.End > end {
		right := w
		right.Start = end + 1
		outside = append(outside, right)
	}
	return []Window{in}, outside
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Overlaps returns every pair of windows of different members that share a point and an
// instant: two primaries at once.
func Overlaps(ws []Window) []string {
	ws = slices.Clone(ws)
	slices.SortFunc(ws, func(a, b Window) int { return a.From.Compare(b.From) })
	var out []string
	for i, a := range ws {
		for _, b := range ws[i+1:] {
			if !b.From.Before(a.Until) {
				continue // b begins once a has ended; later ones may still overlap a
			}
			if a.Member != b.Member && a.Start <= b.End && b.Start <= a.End {
				out = append(out, fmt.Sprintf("%s overlaps %s", a, b))
			}
		}
	}
	return out
}
