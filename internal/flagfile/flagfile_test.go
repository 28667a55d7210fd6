package flagfile

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoadFillsUnsetFlags(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	listen := fs.String("listen", "a", "")
	every := fs.Duration("pass-interval", time.Second, "")
	n := fs.Int("n", 1, "")
	on := fs.Bool("on", false, "")
	params := fs.StringArray("param", nil, "")
	require.NoError(t, fs.Parse([]string{"--listen", "from-flags"}))

	path := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(path, []byte("listen: from-file\npass-interval: 250ms\nn: 3\non: true\nparam: [max_churn=0.05, dead_band=0.1]\n"), 0o644))
	require.NoError(t, Load(fs, path))
	assert.Equal(t, "from-flags", *listen, "the command line wins")
	assert.Equal(t, 250*time.Millisecond, *every)
	assert.Equal(t, 3, *n)
	assert.True(t, *on)
	assert.Equal(t, []string{"max_churn=0.05", "dead_band=0.1"}, *params)
}

func TestLoadNamesBadKeysAndValues(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.Int("n", 1, "")
	path := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(path, []byte("n: many\nbogus: 1\n"), 0o644))
	err := Load(fs, path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"bogus" is not a flag`)
	assert.Contains(t, err.Error(), "n: ")
	assert.Error(t, Load(fs, filepath.Join(t.TempDir(), "missing.yaml")))
	require.NoError(t, os.WriteFile(path, []byte(":\n- ["), 0o644))
	assert.Error(t, Load(fs, path))
}

// Values the command line has no form for are refused, not turned into "<nil>" or "[a b]",
// and a mapping means one thing whatever order Go walks it in.
func TestLoadRefusesValuesWithoutAFlagForm(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"listen:\n", "listen: no value"},
		{"param: [[a, b]]\n", "param: a list where one value belongs"},
		{"param: {a: }\n", "param: a: no value"},
		{"param: {0}\n", "param: 0: no value"},
		{"param: {1: a, 1.0: b}\n", "key 1 is there twice"},
	} {
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		fs.String("listen", "a", "")
		fs.StringArray("param", nil, "")
		err := apply(fs, "c.yaml", []byte(c.yaml))
		require.Error(t, err, c.yaml)
		assert.Contains(t, err.Error(), c.want, c.yaml)
	}
	for range 20 {
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		params := fs.StringArray("param", nil, "")
		require.NoError(t, apply(fs, "c.yaml", []byte("param: [{max_churn: 0.05, dead_band: 0.1, window: 10s, b: 1, a: 2}]\n")))
		assert.Equal(t, []string{"a=2,b=1,dead_band=0.1,max_churn=0.05,window=10s"}, *params)
	}
}
