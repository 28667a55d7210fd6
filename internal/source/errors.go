package source

import "errors"

// Class is what an error of a source asks of whoever got it. Each source marks the errors it
// returns with their class, in one place of its own (a classify function beside the source):
// the callers, an assigner following the clock or a distributor following the changes,
// decide by ClassOf alone.
type Class uint8

const (
	// Unavailable: the source cannot be reached now, or not fully (a connection lost, a
	// server shutting down, starting or failing over, an election, a timeout). Nothing is
	// wrong with the setup: retry with backoff while the process lives.
	Unavailable Class = iota + 1
	// Misconfigured: the source answers, but not as configured (a missing table or column,
	// a dropped publication, a replica identity that does not name the key, no permission,
	// a wrong password). No retry mends it: the message names what to fix.
	Misconfigured
	// Compacted: the source no longer holds the clock asked for (ErrCompacted): start over
	// from a later clock, after a rescan.
	Compacted
)

// Classes lists every class, for labels exported at 0.
var Classes = []Class{Unavailable, Misconfigured, Compacted}

var classNames = [...]string{Unavailable: "unavailable", Misconfigured: "misconfigured", Compacted: "compacted"}

// String returns the class's name, as metrics label it.
func (c Class) String() string {
	if int(c) < len(classNames) && classNames[c] != "" {
		return classNames[c]
	}
	return "unknown"
}

// ErrUnavailable and ErrMisconfigured match (errors.Is) every error a source marked with
// the class of the same name (MarkUnavailable, MarkMisconfigured).
var (
	ErrUnavailable   = errors.New("source: unavailable")
	ErrMisconfigured = errors.New("source: misconfigured")
)

// ErrEnded is a watch the source ended in order, without an error (a server shutting down
// ends its streams so): not a failure, worth a line at info. Sources mark it Unavailable:
// the watch is started again once the source is back.
var ErrEnded = errors.New("source: the watch was ended by the source")

// classified is an error marked with its class; it reads as the error it wraps.
type classified struct {
	class Class
	err   error
}

func (e *classified) Error() string { return e.err.Error() }
func (e *classified) Unwrap() error { return e.err }

func (e *classified) Is(target error) bool {
	return e.class == Unavailable && target == ErrUnavailable || e.class == Misconfigured && target == ErrMisconfigured
}

// mark marks err with class c, unless it has a class already (the innermost mark wins: the
// code nearest the failure knew most).
func mark(c Class, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*classified](err); ok || errors.Is(err, ErrCompacted) {
		return err
	}
	return &classified{class: c, err: err}
}

// MarkUnavailable marks err as Unavailable (nil stays nil; a marked error keeps its class).
func MarkUnavailable(err error) error { return mark(Unavailable, err) }

// MarkMisconfigured marks err as Misconfigured (nil stays nil; a marked error keeps its
// class).
func MarkMisconfigured(err error) error { return mark(Misconfigured, err) }

// ClassOf returns the class of an error of a source: the one it was marked with,
// Compacted for ErrCompacted, and Unavailable for the rest (a deadline of the caller's, an
// error no source marked): an error nobody understood is retried, never taken for a setup
// to fix. ClassOf(nil) is 0.
func ClassOf(err error) Class {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrCompacted):
		return Compacted
	}
	if c, ok := errors.AsType[*classified](err); ok {
		return c.class
	}
	return Unavailable
}
