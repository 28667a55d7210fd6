package chaos_test

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/examples/counter/countercheck"
	"github.com/sliceplane/sliceplane/examples/counter/countermember"
)

// incrEvent is the outcome of one increment as the load saw it: the count answered (ok), or
// none (an error, a refusal, no answer).
type incrEvent struct {
	key   string
	at    time.Time
	count int64
	ok    bool
}

// incrLog is the load's HTTP transport to the proxy: it passes each increment on and
// records its outcome with the time it came, which the history does not keep.
type incrLog struct {
	base http.RoundTripper

	mu     sync.Mutex
	events []incrEvent
	last   map[string]time.Time // each key's last answered increment
}

func (l *incrLog) RoundTrip(req *http.Request) (*http.Response, error) {
	key := strings.TrimPrefix(req.URL.Path, countermember.IncrPath)
	resp, err := l.base.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		l.add(incrEvent{key: key, at: time.Now()})
		return resp, err
	}
	// The count, read here and given back to the load as it came.
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	var res countermember.Result
	if err == nil {
		err = json.Unmarshal(b, &res)
	}
	if err != nil {
		l.add(incrEvent{key: key, at: time.Now()})
		return nil, fmt.Errorf("chaos: reading the answer to an increment of %s: %w", key, err)
	}
	l.add(incrEvent{key: key, at: time.Now(), count: res.Count, ok: true})
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return resp, nil
}

func (l *incrLog) add(e incrEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
	if e.ok {
		l.last[e.key] = e.at
	}
}

// unackedSince returns a key of keys with no increment answered after t, if any.
func (l *incrLog) unackedSince(t time.Time, keys []string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		if !l.last[k].After(t) {
			return k, false
		}
	}
	return "", true
}

// snapshot returns the events so far.
func (l *incrLog) snapshot() []incrEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// acksByKey returns the times of each key's answered increments, in order.
func acksByKey(events []incrEvent) map[string][]time.Time {
	out := map[string][]time.Time{}
	for _, e := range events {
		if e.ok {
			out[e.key] = append(out[e.key], e.at)
		}
	}
	for _, ts := range out {
		slices.SortFunc(ts, time.Time.Compare)
	}
	return out
}

// longestGap is the time a key had no primary around a fault, as the load measures it: the
// longest time between consecutive answered increments of the key from its last one at or
// before from (from itself if none) through every one answered up to to. A range without a
// primary answers nothing, so its keys' gap spans the time it had none; a key's increments
// come about counterRate/counterKeys times a second, so the measure is that coarse (a key
// with a primary throughout shows gaps of a fraction of a second to a second or so).
func longestGap(acks []time.Time, from, to time.Time) time.Duration {
	i := sort.Search(len(acks), func(i int) bool { return acks[i].After(from) })
	prev := from
	if i > 0 {
		prev = acks[i-1]
	}
	var longest time.Duration
	for ; i < len(acks) && !acks[i].After(to); i++ {
		longest = max(longest, acks[i].Sub(prev))
		prev = acks[i]
	}
	return longest
}

// counterRow is the report of one fault.
type counterRow struct {
	fault, target string
	keys          int // the keys it struck
	// start and end bound the fault, from its beginning to the recovery of every key.
	start, end time.Time
	// gaps are the longest gaps (longestGap) of the keys struck; recovered, the time from
	// the fault's end to every point with a primary and every key taking increments.
	gaps      []time.Duration
	recovered time.Duration
	failures  []string
	// bound is the longest a struck key may go without a primary, by the members' logs
	// (primaryGaps); struck are those keys.
	bound  time.Duration
	struck []string
}

// inject runs one fault, waits until every point has a primary and every key takes
// increments again, and records the gaps of the keys it struck.
func (r *counterRun) inject(i int, f counterFault) {
	r.t.Logf("=== counter fault %d: %s", i, f.name)
	row := counterRow{fault: f.name, start: time.Now()}
	o, err := f.run(r)
	row.target = o.target
	if err != nil {
		row.failures = append(row.failures, fmt.Sprintf("the fault: %v", err))
	}
	healed := o.healed
	if healed.IsZero() {
		healed = time.Now()
	}
	if row.end, err = r.recovered(healed); err != nil {
		row.failures = append(row.failures, err.Error())
		row.end = time.Now()
	}
	row.recovered = row.end.Sub(healed)
	keys := o.keys
	if keys == nil {
		keys = r.keys
	}
	row.keys = len(keys)
	acks := acksByKey(r.incrs.snapshot())
	for _, k := range keys {
		row.gaps = append(row.gaps, longestGap(acks[k], row.start, row.end))
	}
	slices.Sort(row.gaps)
	row.bound, row.struck = f.bound(r.ccfg), keys
	if err := r.c.exited(); err != nil {
		row.failures = append(row.failures, fmt.Sprintf("processes exited unasked: %v", err))
	}
	for _, msg := range row.failures {
		r.t.Errorf("counter fault %d (%s): %s", i, f.name, msg)
	}
	r.rows = append(r.rows, row)
	r.t.Logf("counter fault %d: %s %s: no primary p50 %s max %s over %d keys; recovered %s after it ended", i, f.name,
		row.target, quantileOr(row.gaps, 0.5), quantileOr(row.gaps, 1), row.keys, row.recovered.Round(time.Millisecond))
}

// tally is what the increments of one bucket (a fault kind, or the time between faults)
// came to.
type tally struct {
	acked, failed, duplicates, skipped int64
}

func (t *tally) add(o *tally) {
	if o != nil {
		t.acked, t.failed, t.duplicates, t.skipped = t.acked+o.acked, t.failed+o.failed, t.duplicates+o.duplicates, t.skipped+o.skipped
	}
}

// attribute returns the tally of each row of rows (by index) and of the increments outside
// every row (index -1): each increment counts in the row whose [start, end] holds the time
// it came. A count answered again is a duplicate where the later answer came; a count no
// answer gave is skipped where the answer after the gap came, once the key's failed
// increments (which may have happened) no longer excuse it, first come first excused, so that
// the totals are countercheck's.
func attribute(events []incrEvent, rows []counterRow) map[int]*tally {
	out := map[int]*tally{}
	at := func(t time.Time) *tally {
		i := slices.IndexFunc(rows, func(row counterRow) bool { return !t.Before(row.start) && !t.After(row.end) })
		if out[i] == nil {
			out[i] = &tally{}
		}
		return out[i]
	}
	byKey := map[string][]incrEvent{}
	failed := map[string]int64{}
	for _, e := range events {
		if !e.ok {
			at(e.at).failed++
			failed[e.key]++
			continue
		}
		at(e.at).acked++
		byKey[e.key] = append(byKey[e.key], e)
	}
	for key, acks := range byKey {
		// By count, and by time among answers of one count: the first answer is not a duplicate.
		slices.SortFunc(acks, func(a, b incrEvent) int {
			return cmp.Or(cmp.Compare(a.count, b.count), a.at.Compare(b.at))
		})
		excuses, top := failed[key], int64(0)
		for i, e := range acks {
			switch {
			case i > 0 && e.count == acks[i-1].count:
				at(e.at).duplicates++
			case e.count < 1:
				at(e.at).skipped++
			default:
				gap := e.count - top - 1
				excused := min(gap, excuses)
				excuses -= excused
				at(e.at).skipped += gap - excused
				top = e.count
			}
		}
	}
	return out
}

// ownership kills every member, reads their logs, each incarnation (launch's "### " line
// starts one) apart, and returns the windows in which their applications held points as
// primary. A window still open where an incarnation's log ends closes when the process was
// seen dead: a dead process holds nothing. The members die first so that the logs are read
// whole: a log read while its member runs may lack a demotion that another log, read a
// moment later, shows the successor's promotion after.
func (r *counterRun) ownership() ([]countercheck.Window, error) {
	for _, m := range r.c.counters {
		m.kill()
		r.died(m)
	}
	var out []countercheck.Window
	for _, m := range r.c.counters {
		b, err := os.ReadFile(m.current().LogPath)
		if err != nil {
			return nil, err
		}
		ws, err := incarnationWindows(m.id, string(b), r.deaths[m.id])
		if err != nil {
			return nil, err
		}
		out = append(out, ws...)
	}
	return out, nil
}

// incarnationWindows returns the windows of member's log, whose i-th incarnation ended at
// deaths[i] (if it has).
func incarnationWindows(member, log string, deaths []time.Time) ([]countercheck.Window, error) {
	var starts []int // of the incarnations' first lines
	for i := 0; i < len(log); {
		if strings.HasPrefix(log[i:], "### ") {
			starts = append(starts, i)
		}
		next := strings.IndexByte(log[i:], '\n')
		if next < 0 {
			break
		}
		i += next + 1
	}
	var out []countercheck.Window
	for i, start := range starts {
		end := len(log)
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		ws, err := countercheck.Windows(member, strings.NewReader(log[start:end]))
		if err != nil {
			return nil, err
		}
		for _, w := range ws {
			if i < len(deaths) && w.Until.After(deaths[i]) {
				w.Until = deaths[i]
			}
			out = append(out, w)
		}
	}
	return out, nil
}

// table is the report per fault kind: how many ran, the longest time a struck key had no
// primary by the members' logs (logGaps, by row) against the bound, the gaps between its
// answered increments as the load saw them (longestGap), and the increments during them;
// then the increments between faults and countercheck's totals.
func (r *counterRun) table(res countercheck.Result, windows, overlaps int, logGaps []time.Duration) string {
	var b strings.Builder
	b.WriteString("| fault | count | keys struck | no primary, members' logs: max (bound) | answer gap p50 | p99 | max | recovered (max) | acked | failed | duplicates | skipped |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	tallies := attribute(r.incrs.snapshot(), r.rows)
	var kinds []string
	for _, row := range r.rows {
		if !slices.Contains(kinds, row.fault) {
			kinds = append(kinds, row.fault)
		}
	}
	slices.Sort(kinds)
	for _, kind := range kinds {
		var n, keys int
		var gaps []time.Duration
		var recovered, logGap, bound time.Duration
		var sum tally
		for i, row := range r.rows {
			if row.fault != kind {
				continue
			}
			n, keys, gaps, recovered = n+1, keys+row.keys, append(gaps, row.gaps...), max(recovered, row.recovered)
			logGap, bound = max(logGap, logGaps[i]), row.bound
			sum.add(tallies[i])
		}
		slices.Sort(gaps)
		fmt.Fprintf(&b, "| %s | %d | %d | %s (%s) | %s | %s | %s | %s | %d | %d | %d | %d |\n", kind, n, keys, logGap.Round(time.Millisecond), bound,
			quantileOr(gaps, 0.5), quantileOr(gaps, 0.99), quantileOr(gaps, 1), recovered.Round(time.Millisecond), sum.acked, sum.failed,
			sum.duplicates, sum.skipped)
	}
	var between tally
	between.add(tallies[-1])
	fmt.Fprintf(&b, "| (between faults) | | | | | | | | %d | %d | %d | %d |\n", between.acked, between.failed, between.duplicates, between.skipped)
	fmt.Fprintf(&b, "countercheck: %s excused=%d lost=%d; ownership: %d windows as primary, %d overlaps\n", res, res.Excused,
		res.Lost, windows, overlaps)
	return b.String()
}

// quantileOr is quantile, or "-" for no values.
func quantileOr(d []time.Duration, q float64) string {
	if len(d) == 0 {
		return "-"
	}
	return quantile(d, q).String()
}

// primaryGaps returns, for each key, the longest time within [from, to] that no member's
// application held the key's point as primary, by the members' logs (windows): a measure of
// the fault itself, unlike longestGap, whose increments come a few times a second, at random.
func primaryGaps(windows []countercheck.Window, keys []string, from, to time.Time) []time.Duration {
	var out []time.Duration
	for _, k := range keys {
		h := client.Hash([]byte(k))
		var cover [][2]time.Time
		for _, w := range windows {
			if w.Start <= h && h <= w.End && w.Until.After(from) && w.From.Before(to) {
				cover = append(cover, [2]time.Time{w.From, w.Until})
			}
		}
		slices.SortFunc(cover, func(a, b [2]time.Time) int { return a[0].Compare(b[0]) })
		longest, at := time.Duration(0), from
		for _, c := range cover {
			if c[0].After(at) {
				longest = max(longest, c[0].Sub(at))
			}
			if c[1].After(at) {
				at = c[1]
			}
		}
		if to.After(at) {
			longest = max(longest, to.Sub(at))
		}
		out = append(out, longest)
	}
	slices.Sort(out)
	return out
}

// checkBounds fails each fault whose keys went without a primary longer than its bound, by
// the members' logs, in an exclusive cluster (where the leases bound it); it returns each
// row's longest.
func (r *counterRun) checkBounds(windows []countercheck.Window) []time.Duration {
	out := make([]time.Duration, len(r.rows))
	for i, row := range r.rows {
		gaps := primaryGaps(windows, row.struck, row.start, row.end)
		if len(gaps) == 0 {
			continue
		}
		out[i] = gaps[len(gaps)-1]
		if r.ccfg.exclusive && out[i] > row.bound {
			r.t.Errorf("counter fault %d (%s): a key had no primary for %s, by the members' logs, above the bound of %s",
				i+1, row.fault, out[i].Round(time.Millisecond), row.bound)
		}
	}
	return out
}
