package balance

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// ErrUnknownAlgorithm and ErrBadParam are wrapped by New.
var (
	ErrUnknownAlgorithm = errors.New("balance: unknown algorithm")
	ErrBadParam         = errors.New("balance: bad parameter")
)

// Param describes one tunable constant of an algorithm.
type Param struct {
	Name    string
	Help    string
	Default string
	value   any // *int, *float64 or *uint64 inside the algorithm's config
}

type factory struct {
	help   string
	params func(cfg any) []Param
	config func() any                       // a config holding the defaults
	build  func(cfg any) (Algorithm, error) // validates cfg
}

var registry = map[string]factory{
	"weighted-move": {
		help:   "Slicer's Weighted-Move: clean up, merge cold slices, move or replicate off the hottest node within a churn budget, split hot slices",
		config: func() any { c := DefaultWeightedMoveConfig(); return &c },
		params: func(c any) []Param { return c.(*WeightedMoveConfig).params() },
		build:  func(c any) (Algorithm, error) { return NewWeightedMove(*c.(*WeightedMoveConfig)) },
	},
	HeadroomName: {
		help: "Weighted-Move after replicating the slices with the most load per key until every node " +
			"can shed its forecast's surprise to other replicas (for routers that pick the less busy replica)",
		config: func() any { c := DefaultHeadroomConfig(); return &c },
		params: func(c any) []Param { return c.(*HeadroomConfig).params() },
		build:  func(c any) (Algorithm, error) { return NewHeadroom(*c.(*HeadroomConfig)) },
	},
	"consistent-hash": {
		help:   "a ring with virtual nodes; ignores load",
		config: func() any { c := DefaultConsistentHashConfig(); return &c },
		params: func(c any) []Param { return c.(*ConsistentHashConfig).params() },
		build:  func(c any) (Algorithm, error) { return NewConsistentHash(*c.(*ConsistentHashConfig)) },
	},
	"random": {
		help:   "the seed thesis's random balancer: one key per slice, each on a random node; ignores load",
		config: func() any { c := DefaultRandomConfig(); return &c },
		params: func(c any) []Param { return c.(*RandomConfig).params() },
		build:  func(c any) (Algorithm, error) { return NewRandom(*c.(*RandomConfig)) },
	},
	"range": {
		help:   "static equal ranges, one per node; ignores load",
		config: func() any { return &struct{}{} },
		params: func(any) []Param { return nil },
		build:  func(any) (Algorithm, error) { return StaticRange{}, nil },
	},
	"neighbour-offload": {
		help:   "key-range buckets: a node over the mean by a threshold hands buckets to its less loaded ring neighbour",
		config: func() any { c := DefaultNeighbourOffloadConfig(); return &c },
		params: func(c any) []Param { return c.(*NeighbourOffloadConfig).params() },
		build:  func(c any) (Algorithm, error) { return NewNeighbourOffload(*c.(*NeighbourOffloadConfig)) },
	},
}

// Names returns the registered algorithm names, sorted.
func Names() []string { return slices.Sorted(maps.Keys(registry)) }

// Help returns a one-line description of the named algorithm.
func Help(name string) string { return registry[name].help }

// Params lists the tunable constants of the named algorithm with their defaults.
func Params(name string) ([]Param, error) {
	f, ok := registry[name]
	if !ok {
		return nil, unknown(name)
	}
	return f.params(f.config()), nil
}

// New returns the named algorithm with its default constants overridden by params
// (name -> value). Unknown names, unknown parameters, malformed values and configurations
// that fail validation are errors.
func New(name string, params map[string]string) (Algorithm, error) {
	f, ok := registry[name]
	if !ok {
		return nil, unknown(name)
	}
	cfg := f.config()
	ps := f.params(cfg)
	for _, k := range slices.Sorted(maps.Keys(params)) {
		i := slices.IndexFunc(ps, func(p Param) bool { return p.Name == k })
		if i < 0 {
			return nil, fmt.Errorf("%w: %s has no parameter %q (it has: %s)", ErrBadParam, name, k, paramNames(ps))
		}
		if err := ps[i].set(params[k]); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrBadParam, name, err)
		}
	}
	alg, err := f.build(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadParam, name, err)
	}
	return alg, nil
}

// ParseParams turns "k=v" strings into a map, rejecting malformed or repeated ones.
func ParseParams(kvs []string) (map[string]string, error) {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("%w: %q is not name=value", ErrBadParam, kv)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%w: %q is given twice", ErrBadParam, k)
		}
		out[k] = strings.TrimSpace(v)
	}
	return out, nil
}

func unknown(name string) error {
	return fmt.Errorf("%w: %q (known: %s)", ErrUnknownAlgorithm, name, strings.Join(Names(), ", "))
}

func paramNames(ps []Param) string {
	if len(ps) == 0 {
		return "none"
	}
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}

func intParam(name, help string, v *int) Param {
	return Param{Name: name, Help: help, Default: strconv.Itoa(*v), value: v}
}

func floatParam(name, help string, v *float64) Param {
	return Param{Name: name, Help: help, Default: strconv.FormatFloat(*v, 'g', -1, 64), value: v}
}

func uintParam(name, help string, v *uint64) Param {
	return Param{Name: name, Help: help, Default: strconv.FormatUint(*v, 10), value: v}
}

func (p Param) set(s string) error {
	var err error
	switch v := p.value.(type) {
	case *int:
		*v, err = strconv.Atoi(s)
	case *float64:
		*v, err = strconv.ParseFloat(s, 64)
	case *uint64:
		*v, err = strconv.ParseUint(s, 10, 64)
	default:
		panic(fmt.Sprintf("balance: parameter %s has unsupported type %T", p.Name, p.value))
	}
	if err != nil {
		return fmt.Errorf("%s=%q: not a %s", p.Name, s, kind(p.value))
	}
	return nil
}

func kind(v any) string {
	switch v.(type) {
	case *int:
		return "whole number"
	case *uint64:
		return "non-negative whole number"
	}
	return "number"
}
