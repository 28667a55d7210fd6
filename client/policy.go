package client

import (
	"fmt"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/balancer"
)

// Policy chooses one replica of a slice, for Router.Pick.
type Policy int

// The policies a Router can pick replicas by.
const (
	// RoundRobin ("round-robin") takes the replicas of a slice in turn.
	RoundRobin Policy = iota
	// WeightedCapacity ("capacity") takes a replica at random, weighted by its node's
	// capacity.
	WeightedCapacity
	// LeastOutstanding ("least-outstanding") takes the replica with the fewest requests in
	// flight, as reported through Router.Begin; ties go round-robin. It is the "job
	// informed" policy that the seed system measured as the best at keeping tail latency
	// down, and it needs the application to report every request.
	LeastOutstanding
	// PowerOfTwo ("power-of-two") draws two replicas at random and takes the one with fewer
	// requests in flight. It needs Router.Begin as LeastOutstanding does, and spreads a burst
	// better when many routers see the same counts.
	PowerOfTwo
)

var policyNames = [...]string{RoundRobin: "round-robin", WeightedCapacity: "capacity",
	LeastOutstanding: "least-outstanding", PowerOfTwo: "power-of-two"}

// Policies returns the names of the policies, for flag help.
func Policies() []string { return append([]string(nil), policyNames[:]...) }

// String returns the policy's name, as ParsePolicy reads it.
func (p Policy) String() string {
	if p.valid() {
		return policyNames[p]
	}
	return fmt.Sprintf("policy(%d)", int(p))
}

func (p Policy) valid() bool { return p >= 0 && int(p) < len(policyNames) }

// ParsePolicy returns the policy named s (as Policies lists them; case does not matter).
func ParsePolicy(s string) (Policy, error) {
	for p, name := range policyNames {
		if strings.EqualFold(strings.TrimSpace(s), name) {
			return Policy(p), nil
		}
	}
	return 0, fmt.Errorf("client: unknown replica policy %q; use one of %s", s, strings.Join(policyNames[:], ", "))
}

// nodeLoad counts the requests in flight to one node. It fills a cache line of its own:
// every Begin and done writes it, and counters of different nodes packed together would
// make the cores serving them contend for nothing.
type nodeLoad struct {
	n atomic.Int64
	// finished ends a request a grpc-go call began (GRPCDialOptions): one function per
	// node, so that a pick allocates none.
	finished func(balancer.DoneInfo)
	_        [48]byte
}

func newNodeLoad() *nodeLoad {
	l := new(nodeLoad)
	l.finished = func(balancer.DoneInfo) { l.n.Add(-1) }
	return l
}

// replicaSet is a slice's replicas as a Router serves them. Every slice held by the same
// nodes shares one replicaSet, so its round-robin turn is the replica set's, and the map
// needs a pointer per slice rather than a copy of the replicas.
type replicaSet struct {
	replicas []Replica   // sorted by ID, as the map lists them; handed out, never modified
	load     []*nodeLoad // the in-flight counter of each replica's node
	capacity float64     // the sum of the replicas' capacities
	primary  int         // the index of the replica that takes writes; -1 for none
	turn     atomic.Uint64
	// fresh is the set of the replicas that are not stale, which Pick chooses among; nil
	// when none is stale, or all are (a stale node may have caught up since, and a reader
	// it turns away tries the next).
	fresh *replicaSet
}

// hasRoles reports whether the set's replicas divide the roles (a cluster with roles): then
// writes go to its primary, else to any replica.
func (s *replicaSet) hasRoles() bool { return s.replicas[0].Role != RoleReplica }

// readers returns the replicas a read may go to: the fresh ones, if any is stale.
func (s *replicaSet) readers() *replicaSet {
	if s.fresh != nil {
		return s.fresh
	}
	return s
}

// pick returns the index of the replica that policy p chooses. rnd returns uniformly random
// 64-bit numbers.
func (s *replicaSet) pick(p Policy, rnd func() uint64) int {
	n := len(s.replicas)
	if n == 1 {
		return 0
	}
	switch p {
	case WeightedCapacity:
		return s.weighted(rnd)
	case LeastOutstanding:
		return s.leastOutstanding()
	case PowerOfTwo:
		// Two distinct replicas: the second is drawn among the n-1 others.
		i := int(rnd() % uint64(n))
		j := int(rnd() % uint64(n-1))
		if j >= i {
			j++
		}
		if s.load[j].n.Load() < s.load[i].n.Load() {
			return j
		}
		return i
	default:
		return int((s.turn.Add(1) - 1) % uint64(n))
	}
}

// weighted draws a replica with probability proportional to its capacity.
func (s *replicaSet) weighted(rnd func() uint64) int {
	// 53 random bits make a uniform float64 in [0, 1).
	x := float64(rnd()>>11) / (1 << 53) * s.capacity
	for i, r := range s.replicas {
		if x < r.Capacity {
			return i
		}
		x -= r.Capacity
	}
	return len(s.replicas) - 1 // rounding left x just short of the total
}

// leastOutstanding returns the replica with the fewest requests in flight. Replicas that
// tie take turns, rather than the first one taking every request while all are idle.
func (s *replicaSet) leastOutstanding() int {
	best, least, ties := 0, s.load[0].n.Load(), uint64(1)
	for i := 1; i < len(s.load); i++ {
		switch l := s.load[i].n.Load(); {
		case l < least:
			best, least, ties = i, l, 1
		case l == least:
			ties++
		}
	}
	if ties == 1 {
		return best
	}
	k := (s.turn.Add(1) - 1) % ties
	for i, l := range s.load {
		if l.n.Load() == least {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return best // the counts moved between the two reads: the first is as good
}
