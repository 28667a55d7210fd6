package flagfile

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// flags returns a flag set with a flag of each kind the commands use.
func flags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.String("listen", "127.0.0.1:7000", "")
	fs.Duration("pass-interval", time.Second, "")
	fs.Int("n", 1, "")
	fs.Float64("ratio", 0.5, "")
	fs.Bool("on", false, "")
	fs.StringArray("param", nil, "")
	fs.StringSlice("etcd", nil, "")
	fs.StringToString("labels", nil, "")
	return fs
}

func values(fs *pflag.FlagSet) map[string]string {
	out := map[string]string{}
	fs.VisitAll(func(f *pflag.Flag) { out[f.Name] = f.Value.String() })
	return out
}

// FuzzLoad checks that a config file means one thing: loading it twice sets the same values
// and reports the same errors, and an accepted file sets no flag to text the file does not
// hold (such as "<nil>" for a key without a value).
func FuzzLoad(f *testing.F) {
	for _, s := range []string{
		"listen: 0.0.0.0:7000\npass-interval: 250ms\nn: 3\non: true\nparam: [max_churn=0.05, dead_band=0.1]\n",
		"etcd: [127.0.0.1:2379, 127.0.0.1:2479]\nlabels: {zone: a, rack: r1, tier: hot}\nratio: 1e-3\n",
		"param: {max_churn: 0.05, dead_band: 0.1, window: 10s}\n",
		"listen:\n",
		"param: [[a, b]]\n",
		"n: many\nbogus: 1\n",
		":\n- [",
		"n: 0x10\non: yes\nratio: .inf\n",
		"a: &a [x, x]\nb: &b [*a, *a]\nparam: *b\n",
		"listen: 2001-12-14\n",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fs1, fs2 := flags(), flags()
		err1, err2 := apply(fs1, "c.yaml", data), apply(fs2, "c.yaml", data)
		if errText(err1) != errText(err2) {
			t.Fatalf("loaded twice, the file gives\n%v\nthen\n%v", err1, err2)
		}
		v1, v2 := values(fs1), values(fs2)
		for name, v := range v1 {
			if v2[name] != v {
				t.Fatalf("loaded twice, --%s is %q then %q", name, v, v2[name])
			}
		}
		if err1 != nil {
			return
		}
		for name, v := range v1 {
			if strings.Contains(v, "<nil>") && !strings.Contains(string(data), "<nil>") {
				t.Fatalf("--%s is %q", name, v)
			}
		}
	})
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
