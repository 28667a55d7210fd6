package core

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// configured returns the algorithm and constants cfg gives, as Meta.Configured records them:
// the algorithm's name, then each constant as name=value, sorted.
func configured(cfg Config) string {
	var b strings.Builder
	b.WriteString(cfg.Algorithm)
	for _, k := range slices.Sorted(maps.Keys(cfg.Params)) {
		fmt.Fprintf(&b, " %s=%s", k, cfg.Params[k])
	}
	return b.String()
}

// configChanged makes the stored settings m follow the core's config where the config
// changed since a leader last applied it: the config's algorithm and constants replace the
// stored ones (those of a SetAlgorithm, or of the config before). A store from before
// Configured existed adopts the config as applied, keeping its algorithm. It reports
// whether the algorithm was replaced.
func (c *Core) configChanged(m *Meta) bool {
	want := configured(c.cfg)
	if m.Configured == want {
		return false
	}
	replaced := m.Configured != ""
	if replaced {
		m.Algorithm, m.Params = c.cfg.Algorithm, maps.Clone(c.cfg.Params)
	}
	m.Configured = want
	return replaced
}

// reconfigure replaces the core's config with cfg: checked whole first, so that a config
// refused changes nothing. A leader persists a new algorithm or new constants and uses them
// from its next pass; the node TTL, zones and replica counts apply at once.
func (c *Core) reconfigure(now time.Time, cfg Config, out *Output) {
	// Before Fill, whose refusal of a role model would hide that it cannot change here.
	if roles, err := assignment.ParseRoleModel(cfg.Roles); err == nil && roles.Name != c.roles.Name || cfg.Exclusive != c.cfg.Exclusive {
		out.Reply = &Reply{Err: fmt.Errorf("%w: the role model (%s to %s) and the exclusive mode (%v to %v) change only with a new term",
			ErrInvalid, c.roles.Name, roles.Name, c.cfg.Exclusive, cfg.Exclusive)}
		return
	}
	if err := cfg.Fill(); err != nil {
		out.Reply = &Reply{Err: err}
		return
	}
	if _, err := c.newAlgorithm(cfg.Algorithm, cfg.Params); err != nil {
		out.Reply = &Reply{Err: err}
		return
	}
	if c.inflight != nil { // a driver steps it between writes: never here
		out.Reply = &Reply{Err: ErrWriteInFlight}
		return
	}
	c.cfg = cfg
	if !c.leading {
		return
	}
	c.expiryAt = c.nextExpiry()
	m := c.meta
	if !c.configChanged(&m) {
		return
	}
	ch, err := c.setAlgorithm(m.Algorithm, m.Params)
	if err != nil { // checked above
		out.Reply = &Reply{Err: err}
		return
	}
	ch.write.Meta.Configured = m.Configured
	ch.summary = "config changed: " + ch.summary
	c.propose(now, ch, out)
}
