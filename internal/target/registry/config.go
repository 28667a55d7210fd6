package registry

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sliceplane/sliceplane/internal/assigner/core"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/sourceflag"
	"github.com/sliceplane/sliceplane/internal/target"
)

// Config is a target's own settings (target.yaml). A field left out keeps the assigner's
// flag, so a target says only how it differs:
//
//	algorithm: weighted-move
//	params: {hold_passes: "6"}
//	roles: primary-secondary
//	exclusive: true
//	node_ttl: 10s
//	min_replicas: 2
//	max_replicas: 3
//	zone_label: zone
//	churn_budget: 0.05
//	imbalance_tolerance: tight
type Config struct {
	// Algorithm and Params choose the balancing algorithm (slicectl algorithm list). Params
	// given with another algorithm than the flags' replace the flags' params.
	Algorithm string            `yaml:"algorithm,omitempty" json:"algorithm,omitempty"`
	Params    map[string]string `yaml:"params,omitempty" json:"params,omitempty"`
	// Roles is the role model (replicas, primary-secondary); Exclusive gives primaries
	// leases.
	Roles     string `yaml:"roles,omitempty" json:"roles,omitempty"`
	Exclusive *bool  `yaml:"exclusive,omitempty" json:"exclusive,omitempty"`
	// NodeTTL is how long a member lives without a heartbeat, as --node-ttl.
	NodeTTL string `yaml:"node_ttl,omitempty" json:"node_ttl,omitempty"`
	// MinReplicas is the replica floor, as --min-replicas; MaxReplicas the algorithm's
	// max_replicas.
	MinReplicas *int `yaml:"min_replicas,omitempty" json:"min_replicas,omitempty"`
	MaxReplicas *int `yaml:"max_replicas,omitempty" json:"max_replicas,omitempty"`
	// ZoneLabel names the label of a member's zone, as --zone-label.
	ZoneLabel *string `yaml:"zone_label,omitempty" json:"zone_label,omitempty"`
	// ChurnBudget is the share of keys a pass may move: the algorithm's max_churn.
	ChurnBudget *float64 `yaml:"churn_budget,omitempty" json:"churn_budget,omitempty"`
	// Tolerance is how much imbalance passes leave alone, for users who would rather not
	// tune constants: tight, default or loose (Tolerances).
	Tolerance string `yaml:"imbalance_tolerance,omitempty" json:"imbalance_tolerance,omitempty"`
	// Source is where the target's items are, when not under its etcd data prefix: the
	// source flags' names and values (source: postgres, pg-dsn, pg-table, pg-publication,
	// ...). The assigner follows its clock, which stamps the target's quanta; the target's
	// distributors must read the same table (their --sources). Keep a password out of the
	// DSN (a password file, or a client certificate): the registry is readable by viewers,
	// who are shown the DSN without its password only.
	Source map[string]string `yaml:"source,omitempty" json:"source,omitempty"`
}

// SourceOptions returns the target's source, and false when it is its etcd data prefix.
func (c Config) SourceOptions() (sourceflag.Options, bool, error) {
	if len(c.Source) == 0 {
		return sourceflag.Options{}, false, nil
	}
	values := make(map[string]any, len(c.Source))
	for k, v := range c.Source {
		values[k] = v
	}
	o, err := sourceflag.FromValues("source", values)
	if err != nil {
		return o, false, fmt.Errorf("%w: %w", target.ErrInvalid, err)
	}
	return o, o.Kind != "" && o.Kind != sourceflag.Etcd, nil
}

// Redacted returns c with the password of its source's DSN replaced, for a reader of the
// registry who needs the rest.
func (c Config) Redacted() Config {
	dsn, ok := c.Source["pg-dsn"]
	if !ok {
		return c
	}
	c.Source = maps.Clone(c.Source)
	c.Source["pg-dsn"] = redactDSN(dsn)
	return c
}

// passwordKV matches the password of a key=value DSN.
var passwordKV = regexp.MustCompile(`(password\s*=\s*)('[^']*'|\S+)`)

// redactDSN replaces the password of a URL or key=value DSN with "REDACTED".
func redactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "REDACTED")
		}
		return u.String()
	}
	return passwordKV.ReplaceAllString(dsn, "${1}REDACTED")
}

// Tolerances are the imbalance tolerance presets: the max/mean node load a pass leaves
// alone (the algorithm's dead_band), in the spirit of Dicer's presets (2.5 %, 10 %, 40 %).
var Tolerances = map[string]float64{"tight": 0.025, "default": 0.10, "loose": 0.40}

// Parse reads a target.yaml strictly: an unknown field is an error, as a misspelt one would
// otherwise be ignored. An empty file is a target with every flag's setting.
func Parse(data []byte) (Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("%w: %w", target.ErrInvalid, err)
	}
	return c, nil
}

// Equal reports whether c and o say the same, as target.yaml.
func (c Config) Equal(o Config) bool { return bytes.Equal(c.Marshal(), o.Marshal()) }

// Marshal returns c as target.yaml.
func (c Config) Marshal() []byte {
	out, err := yaml.Marshal(c)
	if err != nil { // a struct of strings, numbers and maps of strings always marshals
		panic(fmt.Sprintf("registry: marshalling a config: %v", err))
	}
	return out
}

// Apply returns base, the core config of the assigner's flags before defaults are filled,
// with c's settings over it, filled and checked: the error names the first field that
// cannot be used.
func (c Config) Apply(base core.Config) (core.Config, error) {
	out := base
	out.Params = maps.Clone(base.Params)
	if c.Algorithm != "" && c.Algorithm != base.Algorithm {
		out.Algorithm, out.Params = c.Algorithm, nil
	}
	if out.Params == nil {
		out.Params = map[string]string{}
	}
	maps.Copy(out.Params, c.Params)
	if err := c.applySettings(&out); err != nil {
		return core.Config{}, err
	}
	if _, _, err := c.SourceOptions(); err != nil {
		return core.Config{}, err
	}
	if err := out.Fill(); err != nil {
		return core.Config{}, fmt.Errorf("%w: %w", target.ErrInvalid, err)
	}
	name := out.Algorithm
	if name == "" {
		name = "weighted-move"
	}
	if _, err := core.NewAlgorithm(name, out.Params); err != nil {
		return core.Config{}, fmt.Errorf("%w: algorithm %s with params %v: %w", target.ErrInvalid, name, out.Params, err)
	}
	return out, nil
}

// applySettings sets out's fields from c's, each checked on its own so that the refusal
// names the field.
func (c Config) applySettings(out *core.Config) error {
	if c.Roles != "" {
		if _, err := assignment.ParseRoleModel(c.Roles); err != nil {
			return fmt.Errorf("%w: roles: %w", target.ErrInvalid, err)
		}
		out.Roles = c.Roles
	}
	if c.Exclusive != nil {
		out.Exclusive = *c.Exclusive
	}
	if c.NodeTTL != "" {
		d, err := time.ParseDuration(c.NodeTTL)
		if err != nil || d < time.Second {
			return fmt.Errorf("%w: node_ttl %q: want a duration of at least 1s", target.ErrInvalid, c.NodeTTL)
		}
		out.NodeTTL = d
	}
	if c.MinReplicas != nil {
		if *c.MinReplicas < 0 {
			return fmt.Errorf("%w: min_replicas %d: want >= 0", target.ErrInvalid, *c.MinReplicas)
		}
		out.MinReplicas = *c.MinReplicas
	}
	if c.MaxReplicas != nil {
		if *c.MaxReplicas < 0 || c.MinReplicas != nil && *c.MaxReplicas > 0 && *c.MaxReplicas < *c.MinReplicas {
			return fmt.Errorf("%w: max_replicas %d: want >= 0 (0: no cap) and at least min_replicas", target.ErrInvalid, *c.MaxReplicas)
		}
		out.Params["max_replicas"] = strconv.Itoa(*c.MaxReplicas)
	}
	if c.ZoneLabel != nil {
		out.ZoneLabel = *c.ZoneLabel
	}
	if c.ChurnBudget != nil {
		if b := *c.ChurnBudget; !(b > 0 && b <= 1) {
			return fmt.Errorf("%w: churn_budget %g: want a share of the keys in (0, 1]", target.ErrInvalid, b)
		}
		out.Params["max_churn"] = strconv.FormatFloat(*c.ChurnBudget, 'g', -1, 64)
	}
	if c.Tolerance != "" {
		band, ok := Tolerances[c.Tolerance]
		if !ok {
			return fmt.Errorf("%w: imbalance_tolerance %q: want tight, default or loose", target.ErrInvalid, c.Tolerance)
		}
		out.Params["dead_band"] = strconv.FormatFloat(band, 'g', -1, 64)
	}
	return nil
}

// MarshalFile writes a file of targets as ParseFile reads it.
func MarshalFile(targets map[string]Config) []byte {
	out, err := yaml.Marshal(struct {
		Targets map[string]Config `yaml:"targets"`
	}{targets})
	if err != nil { // as Marshal: a config always marshals
		panic(fmt.Sprintf("registry: marshalling a file of targets: %v", err))
	}
	return out
}

// ParseFile reads a file of targets (the assigner's --targets), each by its name with its
// target.yaml below it:
//
//	targets:
//	  kv: {min_replicas: 2}
//	  counter: {roles: primary-secondary, exclusive: true}
//
// An unknown field, a bad name or the default target is an error that names it.
func ParseFile(data []byte) ([]Record, error) {
	var f struct {
		Targets map[string]yaml.Node `yaml:"targets"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %w", target.ErrInvalid, err)
	}
	out := make([]Record, 0, len(f.Targets))
	for _, name := range slices.Sorted(maps.Keys(f.Targets)) {
		if err := checkMutable(name); err != nil {
			return nil, err
		}
		body, err := yaml.Marshal(f.Targets[name])
		if err == nil {
			var c Config
			c, err = Parse(body)
			out = append(out, Record{Name: name, Config: c})
		}
		if err != nil {
			return nil, fmt.Errorf("target %s: %w", name, err)
		}
	}
	return out, nil
}
