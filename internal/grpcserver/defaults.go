package grpcserver

import (
	"fmt"
	"time"
)

// Setting is a number of a server's Config that zero leaves to a default.
type Setting[T int | time.Duration] struct {
	name string
	v    *T
	def  T
}

// Default is the setting *v, called name in errors (its flag, "--pass-interval", when it has
// one), whose zero stands for def.
func Default[T int | time.Duration](name string, v *T, def T) Setting[T] {
	return Setting[T]{name: name, v: v, def: def}
}

// FillDefaults sets each zero setting to its default and refuses a negative one; its errors
// start with server, the name of the server whose Config it checks.
func FillDefaults[T int | time.Duration](server string, settings ...Setting[T]) error {
	for _, s := range settings {
		switch {
		case *s.v < 0:
			return fmt.Errorf("%s: %s %v: want more than 0, or 0 for the default (%v)", server, s.name, *s.v, s.def)
		case *s.v == 0:
			*s.v = s.def
		}
	}
	return nil
}
