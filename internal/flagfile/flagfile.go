// Package flagfile fills command-line flags from a YAML file, so that a long command line can
// live in a config file. Keys are flag names; flags given on the command line win.
package flagfile

import (
	"errors"
	"fmt"
	"os"
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
	var values map[string]any
	if err := yaml.Unmarshal(data, &values); err != nil {
		return fmt.Errorf("flagfile: %s: %w", path, err)
	}
	var errs []error
	for key, v := range values {
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
			if err := f.Value.Set(text(item)); err != nil {
				errs = append(errs, fmt.Errorf("flagfile: %s: %s: %w", path, key, err))
			}
		}
	}
	return errors.Join(errs...)
}

// text renders a YAML scalar as the flag would read it from a command line.
func text(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case bool:
		return strconv.FormatBool(x)
	case int:
		return strconv.Itoa(x)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case map[string]any: // k: v pairs, as for --param
		var parts []string
		for k, val := range x {
			parts = append(parts, k+"="+text(val))
		}
		return strings.Join(parts, ",")
	}
	return fmt.Sprint(v)
}
