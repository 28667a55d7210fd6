// Package deploy_test checks the deployment files in deploy/ against each other and against
// the code: the compose stack, the Kubernetes manifests, the Prometheus configuration and
// alerting rules and the Grafana dashboard. Nothing here needs Docker, a cluster or the
// network; promtool is used when it is on PATH.
package deploy_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/sliceplane/sliceplane/internal/assignermain"
	"github.com/sliceplane/sliceplane/internal/distributormain"
	"github.com/sliceplane/sliceplane/internal/slicectl"
)

// Paths, relative to this package's directory (where go test runs).
const (
	composeFile     = "compose/docker-compose.yml"
	prometheusFile  = "prometheus/prometheus.yml"
	rulesFile       = "prometheus/rules.yml"
	rulesTestFile   = "prometheus/rules_test.yml"
	sourceRulesTest = "prometheus/rules_source_test.yml"
	dashboardFile   = "grafana/sliceplane.json"
	kubernetesDir   = "kubernetes"
	e2eScript       = "compose/e2e.sh"
	buildScript     = "compose/build-images.sh"
	dockerfile      = "docker/Dockerfile"
	imageRepository = "sliceplane/"
)

// readYAML decodes every document of a YAML file into generic values, failing the test on
// a syntax error. Empty documents are dropped.
func readYAML(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []map[string]any
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "%s: document %d", path, len(docs)+1)
		if doc != nil {
			docs = append(docs, doc)
		}
	}
	return docs
}

// The accessors below walk generic YAML values; a missing key or a value of another type
// gives the zero value, and the assertions then say what is missing.

func m(v any, keys ...string) map[string]any {
	for _, k := range keys {
		mm, _ := v.(map[string]any)
		v = mm[k]
	}
	mm, _ := v.(map[string]any)
	return mm
}

func s(v any, keys ...string) string {
	if len(keys) > 0 {
		v = m(v, keys[:len(keys)-1]...)[keys[len(keys)-1]]
	}
	switch x := v.(type) {
	case string:
		return x
	case nil:
		return ""
	default:
		b, _ := yaml.Marshal(x)
		return strings.TrimSpace(string(b))
	}
}

func l(v any, keys ...string) []any {
	if len(keys) > 0 {
		v = m(v, keys[:len(keys)-1]...)[keys[len(keys)-1]]
	}
	x, _ := v.([]any)
	return x
}

func strs(v []any) []string {
	out := make([]string, 0, len(v))
	for _, x := range v {
		out = append(out, s(x))
	}
	return out
}

// flagArgs returns the names of the long flags among a command line's arguments:
// "--listen=0.0.0.0:7070" and "--listen" "0.0.0.0:7070" both give "listen".
func flagArgs(args []string) []string {
	var names []string
	for _, a := range args {
		if name, ok := strings.CutPrefix(a, "--"); ok && name != "" {
			name, _, _ = strings.Cut(name, "=")
			names = append(names, name)
		}
	}
	return names
}

// flagValue returns the value of --name among args ("--name=v" or "--name v"), and whether
// it is there.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// commands are the real command lines of the binaries whose flags the deployment files
// use, by image name.
var commands = map[string]func() *cobra.Command{
	"assigner":    assignermain.NewCommand,
	"distributor": distributormain.NewCommand,
	// The root command's flags only: the tool service presets --assigner.
	"slicectl": func() *cobra.Command { return slicectl.NewRootCommand(io.Discard, io.Discard) },
}

// checkFlags fails the test for every flag in args that the binary's command does not
// define; args naming a subcommand ("certs", "init", ...) are checked against its flags and
// those it inherits.
func checkFlags(t *testing.T, where, binary string, args []string) {
	t.Helper()
	newCmd, ok := commands[binary]
	if !ok {
		return
	}
	cmd := newCmd()
	if sub, _, err := cmd.Find(args); err == nil && sub != nil {
		cmd = sub
	}
	names := flagArgs(args)
	require.NotEmpty(t, names, "%s: %s has no flags at all", where, binary)
	for _, name := range names {
		if cmd.Flag(name) == nil && cmd.PersistentFlags().Lookup(name) == nil {
			t.Errorf("%s: %s has no flag --%s", where, cmd.CommandPath(), name)
		}
	}
}

// imageBinary returns the binary an image of ours runs ("sliceplane/assigner:dev" gives
// "assigner"), or "" for another image.
func imageBinary(image string) string {
	rest, ok := strings.CutPrefix(image, imageRepository)
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(rest, ":")
	return name
}

// yamlFiles returns the .yaml and .yml files under dir.
func yamlFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			files = append(files, path)
		}
		return err
	})
	require.NoError(t, err)
	require.NotEmpty(t, files, "no YAML under %s", dir)
	return files
}

var hostPortRE = regexp.MustCompile(`^([A-Za-z0-9.-]+):([0-9]+)$`)

// splitHostPort splits "host:port", failing the test on anything else.
func splitHostPort(t *testing.T, where, addr string) (string, string) {
	t.Helper()
	mm := hostPortRE.FindStringSubmatch(addr)
	if mm == nil {
		t.Errorf("%s: %q is not host:port", where, addr)
		return "", ""
	}
	return mm[1], mm[2]
}
