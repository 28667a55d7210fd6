package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// ErrWorkload is wrapped by errors about a workload spec.
var ErrWorkload = errors.New("sim: bad workload")

// Workload generates the load of every key, epoch by epoch. Keys are numbered 0..Keys()-1;
// key i is named "key-i".
type Workload interface {
	// Spec returns the spec the workload was parsed from, for reports.
	Spec() string
	// Keys returns the number of keys.
	Keys() int
	// Fill sets loads[i] to key i's load during epoch e. loads has Keys() entries.
	Fill(e int, loads []float64)
}

// Workloads lists the built-in workload specs, for help texts.
const Workloads = "uniform | zipf:S | hotspot-shift[:S[:PERIOD]] | flash-crowd[:KEYS[:SHARE]] | diurnal[:PERIOD] | " + NoisyWorkload

// ParseWorkload builds a built-in workload from its spec:
//
//	uniform                     every key has load 1
//	zipf:S                      the key of popularity rank r has load proportional to r^-S
//	hotspot-shift[:S[:PERIOD]]  zipf:S (default 1.1) whose popular keys change every PERIOD
//	                            epochs (default 10)
//	flash-crowd[:KEYS[:SHARE]]  uniform, except that for a quarter of the run, from a quarter
//	                            of the way in, KEYS keys (default 10) carry SHARE (default 0.5)
//	                            of all load
//	diurnal[:PERIOD]            zipf:0.8 whose load rises and falls with a period of PERIOD
//	                            epochs (default 24), at a phase set by each key's place in the
//	                            hash space, as if keys lived in different time zones
//	noisy[:S[:NOISE[:...]]]     zipf:S with the noise of real traffic: keys appearing and
//	                            vanishing, bursts, phase changes, counting noise (parseNoisy)
//
// Loads are scaled so that the mean key load is about 1. seed picks which keys are popular.
func ParseWorkload(spec string, keys, epochs int, seed uint64) (Workload, error) {
	if keys < 1 {
		return nil, fmt.Errorf("%w: --keys=%d: want at least 1", ErrWorkload, keys)
	}
	name, rest, _ := strings.Cut(spec, ":")
	var args []float64
	if rest != "" {
		for _, f := range strings.Split(rest, ":") {
			x, err := strconv.ParseFloat(f, 64)
			if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
				return nil, fmt.Errorf("%w: %q: %q is not a number", ErrWorkload, spec, f)
			}
			args = append(args, x)
		}
	}
	arg := func(i int, def float64) float64 {
		if i < len(args) {
			return args[i]
		}
		return def
	}
	if name == "noisy" {
		return parseNoisy(workload{spec: spec, keys: keys}, args, seed)
	}
	maxArgs := map[string]int{"uniform": 0, "zipf": 1, "hotspot-shift": 2, "flash-crowd": 2, "diurnal": 1}
	n, known := maxArgs[name]
	switch {
	case !known:
		return nil, fmt.Errorf("%w: %q (want %s)", ErrWorkload, spec, Workloads)
	case len(args) > n:
		return nil, fmt.Errorf("%w: %q takes at most %d parameters (want %s)", ErrWorkload, spec, n, Workloads)
	case name == "zipf" && len(args) != 1:
		return nil, fmt.Errorf("%w: %q: give the exponent, as in zipf:1.1", ErrWorkload, spec)
	}
	base := workload{spec: spec, keys: keys}
	switch name {
	case "uniform":
		return &uniform{base}, nil
	case "zipf", "hotspot-shift", "diurnal":
		s := arg(0, 1.1)
		if name == "diurnal" {
			s = 0.8
		}
		if s < 0 || s > 10 {
			return nil, fmt.Errorf("%w: %q: exponent %v: want 0..10", ErrWorkload, spec, s)
		}
		z := newZipf(base, s, seed)
		switch name {
		case "hotspot-shift":
			period := arg(1, 10)
			if period < 1 || period != math.Trunc(period) {
				return nil, fmt.Errorf("%w: %q: period %v: want a whole number of epochs >= 1", ErrWorkload, spec, period)
			}
			return &hotspotShift{zipf: z, period: int(period), seed: seed}, nil
		case "diurnal":
			period := arg(0, 24)
			if period < 2 {
				return nil, fmt.Errorf("%w: %q: period %v: want at least 2 epochs", ErrWorkload, spec, period)
			}
			return &diurnal{zipf: z, period: period}, nil
		}
		return z, nil
	case "flash-crowd":
		crowd, share := arg(0, 10), arg(1, 0.5)
		if crowd < 1 || crowd != math.Trunc(crowd) || int(crowd) > keys {
			return nil, fmt.Errorf("%w: %q: crowd of %v keys: want a whole number 1..%d", ErrWorkload, spec, crowd, keys)
		}
		if share <= 0 || share >= 1 {
			return nil, fmt.Errorf("%w: %q: share %v: want 0 < share < 1", ErrWorkload, spec, share)
		}
		start := epochs / 4
		return &flashCrowd{workload: base, crowd: permutation(keys, seed)[:int(crowd)], share: share,
			start: start, end: start + max(1, epochs/4)}, nil
	}
	panic("unreachable: every known workload is handled above")
}

type workload struct {
	spec string
	keys int
}

func (w workload) Spec() string { return w.spec }
func (w workload) Keys() int    { return w.keys }

type uniform struct{ workload }

func (u *uniform) Fill(_ int, loads []float64) {
	for i := range loads {
		loads[i] = 1
	}
}

// zipf gives the key of rank r (0-based) the load weight[r]; rank[i] is key i's rank, a
// seeded permutation, so that popularity has nothing to do with key names.
type zipf struct {
	workload
	weight []float64
	rank   []int32
}

func newZipf(base workload, s float64, seed uint64) *zipf {
	z := &zipf{workload: base, weight: make([]float64, base.keys), rank: permutation(base.keys, seed)}
	var sum float64
	for r := range z.weight {
		z.weight[r] = math.Pow(float64(r+1), -s)
		sum += z.weight[r]
	}
	for r := range z.weight {
		z.weight[r] *= float64(base.keys) / sum
	}
	return z
}

func (z *zipf) Fill(_ int, loads []float64) {
	for i := range loads {
		loads[i] = z.weight[z.rank[i]]
	}
}

// permutation returns a seeded random permutation of 0..n-1.
func permutation(n int, seed uint64) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(i)
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	rng.Shuffle(n, func(i, j int) { p[i], p[j] = p[j], p[i] })
	return p
}

// hotspotShift is zipf whose ranking rotates by a seeded offset every period epochs: the hot
// keys of one phase are ordinary keys in the next.
type hotspotShift struct {
	*zipf
	period int
	seed   uint64
}

func (h *hotspotShift) Fill(e int, loads []float64) {
	phase := uint64(e / h.period)
	off := 0
	if phase > 0 {
		off = rand.New(rand.NewPCG(h.seed, phase)).IntN(h.keys)
	}
	for i := range loads {
		r := int(h.rank[i]) + off
		if r >= h.keys {
			r -= h.keys
		}
		loads[i] = h.weight[r]
	}
}

type flashCrowd struct {
	workload
	crowd      []int32
	share      float64
	start, end int
}

func (f *flashCrowd) Fill(e int, loads []float64) {
	for i := range loads {
		loads[i] = 1
	}
	if e < f.start || e >= f.end {
		return
	}
	// The crowd's extra load is share of the total: extra = share/(1-share) * base total.
	extra := f.share / (1 - f.share) * float64(f.keys) / float64(len(f.crowd))
	for _, i := range f.crowd {
		loads[i] += extra
	}
}

// diurnal modulates zipf by a sine whose phase is the key's place in the hash space.
type diurnal struct {
	*zipf
	period float64
	phase  []float64 // set by the runner through setHashes
}

func (d *diurnal) setHashes(h []uint64) {
	d.phase = make([]float64, len(h))
	for i, x := range h {
		d.phase[i] = float64(x>>11) / (1 << 53)
	}
}

func (d *diurnal) Fill(e int, loads []float64) {
	d.zipf.Fill(e, loads)
	t := float64(e) / d.period
	for i := range loads {
		loads[i] *= 1 + 0.8*math.Sin(2*math.Pi*(t+d.phase[i]))
	}
}

// hashAware is a workload that needs every key's hash before its first Fill.
type hashAware interface{ setHashes([]uint64) }
