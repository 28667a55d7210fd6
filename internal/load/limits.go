package load

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Why Check refuses a value, so that callers can count refusals by reason. Errors that
// wrap them wrap ErrBadReport too.
var (
	ErrNotFinite = errors.New("load: not a finite number")
	ErrNegative  = errors.New("load: negative")
	ErrOverCap   = errors.New("load: above the cap")
)

// refusal is an error about one value of a report: it reads as its message and wraps both
// ErrBadReport and the reason.
type refusal struct {
	reason error
	msg    string
}

func (r *refusal) Error() string   { return "load: bad report: " + r.msg }
func (r *refusal) Unwrap() []error { return []error{ErrBadReport, r.reason} }

func refuse(reason error, format string, args ...any) error {
	return &refusal{reason: reason, msg: fmt.Sprintf(format, args...)}
}

// Bounds on what one report may say. They keep every sum the estimator and the balancer
// form finite: a report within them cannot turn a node's load into +Inf, nor an imbalance
// into NaN.
const (
	// MaxKeys bounds a key count: 2^53 is the largest count a float64 holds exactly, and
	// far more keys than one range of one node can hold.
	MaxKeys = 1 << 53
	// MaxWindow bounds a report's window: nodes report every few seconds, and the cap on a
	// report's load grows with its window.
	MaxWindow = time.Hour
	// MaxRate bounds the configurable load rate (see Cap).
	MaxRate = 1e15
	// DefaultRate is the default load rate per unit of capacity: 1e9 a second is a thousand
	// times what one storage node serves in requests a second, and the estimator's sums of
	// thousands of such reports stay finite by hundreds of orders of magnitude.
	DefaultRate = 1e9
)

// Cap returns the most load one report may carry: rate per second of the window per unit of
// the node's weight (its capacity, where 0 means 1). A node cannot serve more than its
// capacity allows in the time it measured.
func Cap(rate float64, window time.Duration, weight float64) float64 {
	return rate * min(window, MaxWindow).Seconds() * weight
}

// Check validates a report against a cap on its load (see Cap): the window is positive and at
// most MaxWindow; every load and key count is finite and non-negative; every key count is at
// most MaxKeys; and the loads of its samples, and those of its hot keys, each add up to at
// most maxLoad. The error names the request field (loads[i], keys[i], hot_keys[i].load), as
// ReportLoadRequest spells it.
func (r Report) Check(maxLoad float64) error {
	if r.Window <= 0 || r.Window > MaxWindow {
		return fmt.Errorf("%w: window %s; want > 0 and at most %s", ErrBadReport, r.Window, MaxWindow)
	}
	var sum float64
	for i, s := range r.Samples {
		if !s.Range.Valid() {
			return fmt.Errorf("%w: sample %d: range %s is empty", ErrBadReport, i, s.Range)
		}
		if err := checkValue("loads", i, s.Load, maxLoad); err != nil {
			return err
		}
		if err := checkValue("keys", i, s.Keys, MaxKeys); err != nil {
			return err
		}
		if sum += s.Load; sum > maxLoad {
			return refuse(ErrOverCap, "loads[0..%d] add up to %.6g, above the cap of %.6g for this node and window", i, sum, maxLoad)
		}
	}
	sum = 0
	for i, k := range r.HotKeys {
		if err := checkValue("hot_keys[].load", i, k.Load, maxLoad); err != nil {
			return err
		}
		if sum += k.Load; sum > maxLoad {
			return refuse(ErrOverCap, "hot_keys[0..%d] add up to %.6g, above the cap of %.6g for this node and window", i, sum, maxLoad)
		}
	}
	return nil
}

// checkValue checks value i of a column; column "a[].b" names it a[i].b.
func checkValue(column string, i int, x, limit float64) error {
	switch {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return refuse(ErrNotFinite, "%s = %v; want a finite number >= 0", field(column, i), x)
	case x < 0:
		return refuse(ErrNegative, "%s = %v; want a finite number >= 0", field(column, i), x)
	case x > limit:
		return refuse(ErrOverCap, "%s = %.6g, above the cap of %.6g for this node and window", field(column, i), x, limit)
	}
	return nil
}

// field names value i of column, "loads[3]", "hot_keys[3].load": only for an error, as a
// leader checks every value of 10,000 reports a second.
func field(column string, i int) string {
	if a, b, ok := strings.Cut(column, "[]"); ok {
		return fmt.Sprintf("%s[%d]%s", a, i, b)
	}
	return fmt.Sprintf("%s[%d]", column, i)
}

// Reason names why err refused a report, for a metric label: not_finite, negative, over_cap,
// or malformed for anything else.
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrNotFinite):
		return "not_finite"
	case errors.Is(err, ErrNegative):
		return "negative"
	case errors.Is(err, ErrOverCap):
		return "over_cap"
	}
	return "malformed"
}
