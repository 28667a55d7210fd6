package sourceflag

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/sliceplane/sliceplane/internal/flagfile"
	"github.com/sliceplane/sliceplane/internal/target"
)

// LoadTargets reads a file of the sources of several targets (a distributor's --sources):
// each target's name, with the source flags' values below it, named as the flags are:
//
//	kv: {}                                   # target kv's etcd data prefix
//	counter:
//	  source: postgres
//	  pg-dsn: postgres://db/counter
//	  pg-table: counters
//
// Each is checked as the flags would be; an error names the target and the key.
func LoadTargets(path string) (map[string]Options, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sourceflag: %w", err)
	}
	var file map[string]map[string]any
	if err := yaml.Unmarshal(data, &file); err != nil {
		return nil, fmt.Errorf("sourceflag: %s: %w", path, err)
	}
	out := map[string]Options{}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(file)) {
		o, err := parseTarget(path, name, file[name])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[target.Name(name)] = o
	}
	return out, errors.Join(errs...)
}

// parseTarget reads the source of target name from values, as its flags would.
func parseTarget(path, name string, values map[string]any) (Options, error) {
	if err := target.CheckRef(name); err != nil {
		return Options{}, fmt.Errorf("sourceflag: %s: %w", path, err)
	}
	return FromValues(path+": target "+name, values)
}

// FromValues reads a source from values keyed as its flags are (source, pg-dsn, pg-table,
// ...), checked as the flags would be; where, in the errors, says where they were read.
func FromValues(where string, values map[string]any) (Options, error) {
	var o Options
	fs := pflag.NewFlagSet(where, pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := flagfile.Apply(fs, where, values); err != nil {
		return o, err
	}
	if err := o.Validate(); err != nil {
		return o, fmt.Errorf("sourceflag: %s: %w", where, err)
	}
	return o, nil
}
