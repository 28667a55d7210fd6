// Package flagfile fills command-line flags from a YAML file, so that a long command line can
// live in a config file. Keys are flag names; flags given on the command line win.
package flagfile

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// Load reads path and sets every flag of fs that the command line left unset. A key that
// names no flag, or a value the flag rejects, is an error that names it.
func Load(fs *pflag.FlagSet, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("flagfile: %w", err)
	}
	return apply(fs, path, data)
}

// apply sets the flags of fs from data, the YAML read from path. Keys are applied in sorted
// order, so that a file means the same on every run and its errors read the same.
func apply(fs *pflag.FlagSet, path string, data []byte) error {
	var values map[string]any
	if err := yaml.Unmarshal(data, &values); err != nil {
		return fmt.Errorf("flagfile: %s: %w", path, err)
	}
	return Apply(fs, path, values)
}

// Apply sets every flag of fs that the command line left unset from values, keys being
// flag names, as read from the YAML of where (named in the errors).
func Apply(fs *pflag.FlagSet, where string, values map[string]any) error {
	path := where
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(values)) {
		v := values[key]
		f := fs.Lookup(key)
		if f == nil {
			errs = append(errs, fmt.Errorf("flagfile: %s: %q is not a flag", path, key))
			continue
		}
		if f.Changed {
			continue // the command line wins
		}
		items := []any{v}
		if list, ok := v.([]any); ok {
			items = list
		}
		for _, item := range items {
			s, err := text(item)
			if err == nil {
				err = f.Value.Set(s)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("flagfile: %s: %s: %w", path, key, err))
			}
		}
	}
	return errors.Join(errs...)
}

// text renders a YAML scalar as the flag would read it from a command line. A null (a key
// with no value) or a list inside a list has no such form, and is refused rather than read as
// "<nil>" or "[a b]".
func text(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "", errors.New("no value; leave the key out to keep the default")
	case string:
		return x, nil
	case bool:
		return strconv.FormatBool(x), nil
	case int:
		return strconv.Itoa(x), nil
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), nil
	case []any:
		return "", errors.New("a list where one value belongs")
	case map[string]any: // k: v pairs, as for --param
		return pairs(x)
	case map[any]any: // the same, with keys YAML did not read as strings
		m := make(map[string]any, len(x))
		for k, val := range x {
			s, err := text(k)
			if err != nil {
				return "", fmt.Errorf("a key: %w", err)
			}
			if _, dup := m[s]; dup {
				return "", fmt.Errorf("key %s is there twice", s)
			}
			m[s] = val
		}
		return pairs(m)
	}
	return fmt.Sprint(v), nil
}

// pairs renders a mapping as k=v pairs, sorted by key.
func pairs(m map[string]any) (string, error) {
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		s, err := text(m[k])
		if err != nil {
			return "", fmt.Errorf("%s: %w", k, err)
		}
		parts = append(parts, k+"="+s)
	}
	return strings.Join(parts, ","), nil
}
