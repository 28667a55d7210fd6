package core

import (
	"log/slog"
	"time"
)

// sourceState is what the leader knows of its source: reachable, or lost since when and why.
// Leadership does not depend on it: only the etcd lease decides who leads.
type sourceState struct {
	lost          bool
	since         time.Time
	err           string
	misconfigured bool
}

// sourceLost records that the source's clock cannot be followed now.
//
// Balancing passes are held until the source is back: a move's new holders load from the
// source, so a pass now would only start handoffs that wait for it (and roll back, if it
// stays away longer than the handoff timeout), on load reports that grow older meanwhile.
// Everything else goes on: the map is served, nodes register and heartbeat, handoffs under
// way end as their nodes report them loaded, operators change the map, and the clean-up of
// departed nodes still runs at each pass (I1).
func (c *Core) sourceLost(now time.Time, ev SourceLost, out *Output) {
	changed := !c.src.lost || c.src.misconfigured != ev.Misconfigured
	if !c.src.lost {
		c.src.since = now
	}
	c.src.lost, c.src.err, c.src.misconfigured = true, ev.Err, ev.Misconfigured
	if !changed {
		return
	}
	r := Record{Level: slog.LevelWarn, Msg: "the source is unavailable; balancing passes are held until it is back",
		Attrs: []any{"err", ev.Err}}
	if ev.Misconfigured {
		r.Level, r.Msg = slog.LevelError, "the source is misconfigured; balancing passes are held until it is mended"
	}
	out.Log = append(out.Log, r)
}

// sourceBack records that the source answered again (a clock was observed).
func (c *Core) sourceBack(now time.Time, out *Output) {
	if !c.src.lost {
		return
	}
	out.Log = append(out.Log, Record{Level: slog.LevelInfo, Msg: "the source is back; balancing passes resume",
		Attrs: []any{"after", now.Sub(c.src.since)}})
	c.src = sourceState{}
}
