package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// NoisyWorkload is the spec syntax of the noisy workload, for help texts.
const NoisyWorkload = "noisy[:S[:NOISE[:CHURN[:BURSTS[:PHASE[:RATE]]]]]]"

// The noisy workload's defaults. Its shape follows what the analysis of Twitter's production
// cache traces (Yang, Yue, Rashmi, "A large scale analysis of hundreds of in-memory cache
// clusters at Twitter", OSDI 2020; the traces are github.com/twitter/cache-trace) describes:
// Zipf-like popularity, objects that live minutes (short TTLs) rather than forever, and
// spikes of traffic on a few keys. The numbers are chosen, not fitted: no trace can be
// replayed here.
const (
	noisySkew   = 1.0  // Zipf exponent: most of that paper's clusters are at or above 1
	noisyNoise  = 0.25 // sigma of a key's log-normal rate noise per epoch
	noisyChurn  = 0.01 // share of live keys that vanish each epoch: a key lives 100 epochs
	noisyBursts = 1.0  // bursts starting per epoch, on random live keys
	noisyPhase  = 50   // epochs between reshuffles of popularity
	noisyRate   = 10.0 // requests per epoch of the mean key: the Poisson counting noise
	// noisyLive is the share of keys alive at any time; the others wait to appear.
	noisyLive = 0.8
	// A burst lasts 1..noisyBurstLen epochs and adds up to half the hottest key's load.
	noisyBurstLen = 5
)

// parseNoisy builds the noisy workload from its spec's numbers:
//
//	S       Zipf exponent of popularity over live keys (default 1.0), 0..10
//	NOISE   sigma of the log-normal factor (mean 1) by which each live key's rate varies from
//	        one epoch to the next, independently (default 0.25), 0..3
//	CHURN   probability that a live key vanishes in an epoch (default 0.01); as many keys
//	        appear, each with a popularity drawn afresh, so that 80% of keys are live, 0..1
//	BURSTS  mean number of bursts starting each epoch (default 1): a random live key gets, for
//	        1-5 epochs, an extra load of 10-50% of the hottest key's, >= 0
//	PHASE   every PHASE epochs, popularity is reshuffled among the keys (default 50; 0: never)
//	RATE    requests the mean key gets per epoch (default 10): each key's load is a Poisson
//	        count of requests with its rate as mean, over RATE, so that cold keys are noisier
//	        than hot ones, as counted requests are; 0 turns counting noise off
//
// It is deterministic for a seed, whatever order epochs are filled in.
func parseNoisy(base workload, args []float64, seed uint64) (Workload, error) {
	def := []float64{noisySkew, noisyNoise, noisyChurn, noisyBursts, noisyPhase, noisyRate}
	if len(args) > len(def) {
		return nil, fmt.Errorf("%w: %q takes at most %d parameters (want %s)", ErrWorkload, base.spec, len(def), NoisyWorkload)
	}
	copy(def, args)
	s, noise, churn, bursts, phase, rate := def[0], def[1], def[2], def[3], def[4], def[5]
	for _, c := range []struct {
		name string
		ok   bool
		want string
	}{
		{"exponent", s >= 0 && s <= 10, "0..10"},
		{"noise", noise >= 0 && noise <= 3, "0..3"},
		{"churn", churn >= 0 && churn <= 1, "0..1"},
		{"bursts", bursts >= 0 && bursts <= float64(base.keys), fmt.Sprintf("0..%d (the keys)", base.keys)},
		{"phase", phase >= 0 && phase == math.Trunc(phase) && phase <= math.MaxInt32, "a whole number of epochs >= 0"},
		{"rate", rate >= 0 && rate <= 1e9, "0..1e9"},
	} {
		if !c.ok {
			return nil, fmt.Errorf("%w: %q: %s out of range: want %s (%s)", ErrWorkload, base.spec, c.name, c.want, NoisyWorkload)
		}
	}
	n := &noisy{workload: base, noise: noise, churn: churn, bursts: bursts, phase: int(phase), rate: rate, seed: seed,
		weight: newZipf(base, s, seed).weight}
	n.reset()
	return n, nil
}

// noisy is a Zipf workload with the noise of real traffic; see parseNoisy. Its key set,
// popularity and bursts evolve epoch by epoch from one seeded stream; the noise of an epoch
// comes from a stream of its own.
type noisy struct {
	workload
	noise, churn, bursts, rate float64
	phase                      int
	seed                       uint64
	weight                     []float64 // Zipf weight by rank

	at     int // the last epoch stepped to
	rng    *rand.Rand
	rank   []int32 // popularity rank of each key
	live   []bool
	active []noisyBurst
}

type noisyBurst struct {
	key   int
	until int // the last epoch of the burst
	load  float64
}

func (n *noisy) reset() {
	n.at, n.rng, n.active = 0, rand.New(rand.NewPCG(n.seed, 0x6e6f697379)), nil
	n.rank, n.live = permutation(n.keys, n.seed), make([]bool, n.keys)
	for i := range n.live {
		n.live[i] = n.churn == 0 || n.rng.Float64() < noisyLive
	}
	n.startBursts(0)
}

// step moves the key set, popularity and bursts to epoch e, the one after n.at.
func (n *noisy) step(e int) {
	n.at = e
	if n.phase > 0 && e%n.phase == 0 {
		n.rng.Shuffle(n.keys, func(i, j int) { n.rank[i], n.rank[j] = n.rank[j], n.rank[i] })
	}
	if n.churn > 0 {
		appear := min(1, n.churn*noisyLive/(1-noisyLive)) // as many appear as vanish
		for i, live := range n.live {
			switch {
			case live && n.rng.Float64() < n.churn:
				n.live[i] = false
			case !live && n.rng.Float64() < appear:
				n.live[i], n.rank[i] = true, int32(n.rng.IntN(n.keys)) // a new key: new popularity
			}
		}
	}
	kept := n.active[:0]
	for _, b := range n.active {
		if b.until >= e && n.live[b.key] {
			kept = append(kept, b)
		}
	}
	n.active = kept
	n.startBursts(e)
}

func (n *noisy) startBursts(e int) {
	count := int(n.bursts)
	if n.rng.Float64() < n.bursts-math.Trunc(n.bursts) {
		count++
	}
	for range count {
		k := n.rng.IntN(n.keys)
		for tries := 0; !n.live[k] && tries < 8; tries++ {
			k = n.rng.IntN(n.keys)
		}
		n.active = append(n.active, noisyBurst{key: k, until: e + n.rng.IntN(noisyBurstLen),
			load: n.weight[0] * (0.1 + 0.4*n.rng.Float64())})
	}
}

func (n *noisy) Fill(e int, loads []float64) {
	if e < n.at {
		n.reset()
	}
	for n.at < e {
		n.step(n.at + 1)
	}
	// The mean key load is about 1: bursts take their load from the other keys', as a
	// trending key takes a share of the traffic, up to half of it.
	var sum, bursts float64
	for i, live := range n.live {
		if live {
			sum += n.weight[n.rank[i]]
		}
	}
	for _, b := range n.active {
		if n.live[b.key] {
			bursts += b.load
		}
	}
	scale := max(float64(n.keys)-bursts, float64(n.keys)/2) / max(sum, 1e-300)
	rng := rand.New(rand.NewPCG(n.seed, uint64(e)<<1|1))
	for i, live := range n.live {
		loads[i] = 0
		if live {
			loads[i] = n.weight[n.rank[i]] * scale * math.Exp(n.noise*rng.NormFloat64()-n.noise*n.noise/2)
		}
	}
	for _, b := range n.active {
		if n.live[b.key] {
			loads[b.key] += b.load
		}
	}
	if n.rate > 0 {
		for i, l := range loads {
			loads[i] = poisson(rng, l*n.rate) / n.rate
		}
	}
}

// poisson draws a Poisson count of mean m: by Knuth's product of uniforms for small means,
// by the normal approximation for large ones.
func poisson(rng *rand.Rand, m float64) float64 {
	if m <= 0 {
		return 0
	}
	if m > 30 {
		return max(0, math.Round(m+math.Sqrt(m)*rng.NormFloat64()))
	}
	limit, p, k := math.Exp(-m), rng.Float64(), 0.0
	for p > limit {
		p *= rng.Float64()
		k++
	}
	return k
}
