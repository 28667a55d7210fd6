package chaos_test

import (
	"errors"
	"fmt"
	"strings"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
)

// counterFault is one kind of fault of the counter run.
type counterFault struct {
	name string
	run  func(r *counterRun) (counterOutcome, error)
	// bound is the longest a key struck may go without a primary, by the members' logs
	// (primaryGaps), by the run's settings.
	bound func(cfg counterConfig) time.Duration
}

// primaryBound bounds a fault of one primary: its keys have a primary again within its lease
// and a second. The fault's own time counts too: a stop or a cut-off lasts twice the lease,
// and the member may stay primary until its lease ends.
func primaryBound(cfg counterConfig) time.Duration { return cfg.lease + time.Second }

// leaderBound bounds a fault of the assigners' leader or of etcd's: a new leader takes over
// within the session TTL, and in an exclusive cluster waits a lease before it grants a role
// that was not given up.
func leaderBound(cfg counterConfig) time.Duration { return cfg.sessionTTL + cfg.lease + time.Second }

// plannedBound bounds a planned move: a handover waits for no lease, only a demotion, a
// heartbeat and the new primary's claim of its range in PostgreSQL.
func plannedBound(counterConfig) time.Duration { return time.Second }

// counterOutcome is what a fault of the counter run did.
type counterOutcome struct {
	target string
	// keys are the keys whose primary the fault struck (nil: every key, for a fault of the
	// whole cluster); healed is when the fault ended (zero: when run returned).
	keys   []string
	healed time.Time
}

// counterFaults are the faults of the counter run. A primary is stopped or cut off for
// twice its lease: it must have demoted itself, and the range moved on, before it returns.
var counterFaults = []counterFault{
	{"kill-primary", killPrimary, primaryBound},
	{"stop-primary", stopPrimary, primaryBound},
	{"partition-primary", partitionPrimary, primaryBound},
	{"kill-assigner", suiteFault(killAssigner), leaderBound},
	{"stop-assigner", suiteFault(stopAssigner), leaderBound},
	{"kill-etcd-leader", suiteFault(killEtcdLeader), leaderBound},
	{"roll", roll, plannedBound},
}

// suiteFault runs one of the suite's assigner or etcd faults in the counter run.
func suiteFault(f func(*run) (outcome, error)) func(*counterRun) (counterOutcome, error) {
	return func(r *counterRun) (counterOutcome, error) {
		o, err := f(r.run)
		return counterOutcome{target: o.target}, err
	}
}

// pickPrimary picks, by the seed, a running member that is the primary of some keys now,
// and returns it and those keys.
func (r *counterRun) pickPrimary() (*member, []string, error) {
	byMember := r.primaries()
	var candidates []*member
	for _, m := range r.c.counters {
		if len(byMember[m.id]) > 0 && m.alive() && !m.isFrozen() {
			candidates = append(candidates, m)
		}
	}
	if len(candidates) == 0 {
		return nil, nil, errors.New("no running member is the primary of a key")
	}
	m := r.pick(candidates)
	return m, byMember[m.id], nil
}

// died records that m's current incarnation has ended, at the latest now.
func (r *counterRun) died(m *member) { r.deaths[m.id] = append(r.deaths[m.id], time.Now()) }

// killPrimary kills a primary (kill -9), waits until the assigner has taken it out of the
// map, and starts it again under the same ID.
func killPrimary(r *counterRun) (counterOutcome, error) {
	m, keys, err := r.pickPrimary()
	if err != nil {
		return counterOutcome{}, err
	}
	o := counterOutcome{target: fmt.Sprintf("%s (primary of %d keys)", m.id, len(keys)), keys: keys}
	m.kill()
	r.died(m)
	if err := r.takenOut(m.id); err != nil {
		return o, err
	}
	err = r.c.restart(r.ctx, m)
	o.healed = time.Now()
	return o, err
}

// stopPrimary stops a primary (SIGSTOP) for twice the lease, then continues it: it must find
// its lease ended, and its writes refused if it tries one.
func stopPrimary(r *counterRun) (counterOutcome, error) {
	m, keys, err := r.pickPrimary()
	if err != nil {
		return counterOutcome{}, err
	}
	o := counterOutcome{target: fmt.Sprintf("%s (primary of %d keys) for %s", m.id, len(keys), 2*r.ccfg.lease), keys: keys}
	if err := m.stop(); err != nil {
		return o, err
	}
	err = r.hold(2 * r.ccfg.lease)
	m.cont()
	o.healed = time.Now()
	return o, err
}

// partitionPrimary cuts a primary's links to every assigner (its own proxies) for twice the
// lease: it still reaches PostgreSQL and still serves, and must demote itself meanwhile.
func partitionPrimary(r *counterRun) (counterOutcome, error) {
	m, keys, err := r.pickPrimary()
	if err != nil {
		return counterOutcome{}, err
	}
	o := counterOutcome{target: fmt.Sprintf("%s (primary of %d keys) for %s", m.id, len(keys), 2*r.ccfg.lease), keys: keys}
	var ps []*toxiproxy.Proxy
	for _, a := range r.c.assigners {
		ps = append(ps, r.c.proxies["member-"+m.id+"-"+a.id])
	}
	err = r.cut(ps, 2*r.ccfg.lease)
	o.healed = time.Now()
	return o, err
}

// roll restarts every member in turn as an orchestrator does: SIGTERM (it drains: its
// primaries demote and its ranges move while it serves), then the same member again, and
// the next once the restarted one holds slices.
func roll(r *counterRun) (counterOutcome, error) {
	var ids []string
	for _, m := range r.c.counters {
		ids = append(ids, m.id)
		if err := m.current().Stop(counterDrain + 10*time.Second); err != nil {
			return counterOutcome{target: strings.Join(ids, ",")}, err
		}
		r.died(m)
		if err := r.c.restart(r.ctx, m); err != nil {
			return counterOutcome{target: strings.Join(ids, ",")}, err
		}
		if err := r.holdsSlices(m.id); err != nil {
			return counterOutcome{target: strings.Join(ids, ",")}, err
		}
	}
	return counterOutcome{target: strings.Join(ids, ","), healed: time.Now()}, nil
}
