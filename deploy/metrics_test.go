package deploy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvnode"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/distributor"
)

// promqlWords are the PromQL words that are neither metrics nor followed by "(" when used.
var promqlWords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true, "inf": true, "nan": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true, "count": true,
	"count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true,
}

// labelListWords are followed by a parenthesized list of label names.
var labelListWords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// promqlMetrics returns the metric names a PromQL expression selects. It is a tokenizer,
// not a parser: it skips strings, label matchers ({...}), ranges and subqueries ([...]),
// Grafana variables ($x, ${x}), numbers and durations, function calls and the label lists
// of by, on and the like; what identifiers remain are metric names.
func promqlMetrics(expr string) []string {
	var out []string
	r := []rune(expr)
	for i := 0; i < len(r); {
		c := r[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(r) && r[j] != c {
				if r[j] == '\\' {
					j++
				}
				j++
			}
			i = j + 1
		case c == '{':
			i = promqlSkipTo(r, i, '{', '}')
		case c == '[':
			i = promqlSkipTo(r, i, '[', ']')
		case c == '$':
			i++
			if i < len(r) && r[i] == '{' {
				i = promqlSkipTo(r, i, '{', '}')
			}
			for i < len(r) && promqlIdent(r[i], false) {
				i++
			}
		case unicode.IsDigit(c) || c == '.':
			for i < len(r) && (promqlIdent(r[i], false) || r[i] == '.') {
				i++
			}
		case promqlIdent(c, true):
			j := i
			for j < len(r) && promqlIdent(r[j], false) {
				j++
			}
			word := string(r[i:j])
			k := promqlSkipSpace(r, j)
			switch {
			case labelListWords[word]:
				if k < len(r) && r[k] == '(' {
					j = promqlSkipTo(r, k, '(', ')')
				}
			case promqlWords[word]:
			case k < len(r) && r[k] == '(':
				// a function call
			default:
				out = append(out, word)
			}
			i = j
		default:
			i++
		}
	}
	return out
}

// promqlSkipTo returns the index after the close that matches the open at r[i], skipping
// quoted strings.
func promqlSkipTo(r []rune, i int, open, close rune) int {
	depth := 0
	for ; i < len(r); i++ {
		switch r[i] {
		case '"', '\'', '`':
			q := r[i]
			for i++; i < len(r) && r[i] != q; i++ {
				if r[i] == '\\' {
					i++
				}
			}
		case open:
			depth++
		case close:
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return i
}

func promqlIdent(c rune, first bool) bool {
	return c == '_' || c == ':' || unicode.IsLetter(c) || (!first && unicode.IsDigit(c))
}

func promqlSkipSpace(r []rune, i int) int {
	for i < len(r) && unicode.IsSpace(r[i]) {
		i++
	}
	return i
}

func TestPromqlMetrics(t *testing.T) {
	for expr, want := range map[string][]string{
		`up{job="sliceplane-assigner"} == 0`: {"up"},
		`max(sliceplane_assigner_imbalance_ratio and on (instance, job) (sliceplane_assigner_leader == 1))`: {
			"sliceplane_assigner_imbalance_ratio", "sliceplane_assigner_leader"},
		`histogram_quantile(0.99, sum by (le, instance) (rate(a_bucket{instance=~"$d", x="}"}[$__rate_interval])))`: {"a_bucket"},
		`changes(max(sliceplane_assigner_term)[2m:]) > 0`:                                                           {"sliceplane_assigner_term"},
		`scalar(max(a)) - b offset 5m`:                                                                              {"a", "b"},
		`(sum(x) or vector(0)) < 1`:                                                                                 {"x"},
		`sum by (cause) (rate(q_total[1m])) / ignoring(cause) group_left sum(r)`:                                    {"q_total", "r"},
		`rec:rule:name > 1.5e3`:                                                                                     {"rec:rule:name"},
	} {
		assert.Equal(t, want, promqlMetrics(expr), expr)
	}
}

// usedMetrics returns the metric names the dashboard and the alerting rules select, each
// with where it is used, and the names the rules record.
func usedMetrics(t *testing.T) (used map[string][]string, recorded map[string]bool) {
	t.Helper()
	used = map[string][]string{}
	add := func(where, expr string) {
		names := promqlMetrics(expr)
		assert.NotEmpty(t, names, "%s: no metric in %q", where, expr)
		for _, n := range names {
			used[n] = append(used[n], where)
		}
	}
	recorded = map[string]bool{}
	for _, g := range l(readYAML(t, rulesFile)[0], "groups") {
		for _, r := range l(g, "rules") {
			if rec := s(r, "record"); rec != "" {
				recorded[rec] = true
			}
			add(rulesFile+" "+s(r, "alert")+s(r, "record"), s(r, "expr"))
		}
	}
	d := loadDashboard(t)
	for _, e := range dashboardExprs(d) {
		add(dashboardFile+" "+e.where, e.expr)
	}
	return used, recorded
}

// prometheusMetrics are the series Prometheus makes itself, for every target.
var prometheusMetrics = map[string]bool{"up": true, "scrape_duration_seconds": true, "scrape_samples_scraped": true}

// TestDashboardAndRulesUseRealMetrics runs a small Sliceplane in this process (an embedded
// etcd, an assigner, a distributor and a node of the example key-value store), makes it use
// every labelled metric (a load report, an admin call, a read), and checks that every
// metric the dashboard and the alerting rules select is one the code registers.
func TestDashboardAndRulesUseRealMetrics(t *testing.T) {
	t.Parallel()
	used, recorded := usedMetrics(t)
	assignerReg, distributorReg := prometheus.NewRegistry(), prometheus.NewRegistry()
	c := clustertest.New(t, clustertest.Options{
		Assigner:    func(cfg *assigner.Config) { cfg.Registry = assignerReg },
		Distributor: func(cfg *distributor.Config) { cfg.Registry = distributorReg },
	})
	c.StartDistributor("d1")
	node, err := kvnode.New(kvnode.Config{ID: "n1", Listen: "127.0.0.1:0", Assigners: c.Assigners(),
		DataDir: t.TempDir(), ReportInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- node.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	handler := node.Handler()

	// About a second on an idle machine; the bound is for a loaded one.
	wait, stop := context.WithTimeout(context.Background(), 15*time.Second)
	defer stop()
	admin := pb.NewAdminServiceClient(c.Conn())
	_, err = admin.Freeze(wait, &pb.FreezeRequest{Reason: "deploy test"}, grpc.WaitForReady(true))
	require.NoError(t, err)

	var missing []string
	for {
		registered := map[string]bool{}
		for _, reg := range []prometheus.Gatherer{assignerReg, distributorReg} {
			families, err := reg.Gather()
			require.NoError(t, err)
			for _, f := range families {
				addFamily(registered, f.GetName(), f.GetType().String())
			}
		}
		// A read counts in kvstore_node_reads_total; the node's metrics come over its handler.
		handler.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/v1/kv/some-key", nil))
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		require.Equal(t, http.StatusOK, rec.Code)
		textFamilies(t, rec.Body.String(), registered)

		missing = missing[:0]
		for name := range used {
			if !registered[name] && !recorded[name] && !prometheusMetrics[name] {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			return
		}
		select {
		case <-wait.Done():
			slices.Sort(missing)
			for _, name := range missing {
				t.Errorf("%s is registered by no process (used by %s)", name, strings.Join(used[name], "; "))
			}
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// addFamily adds the series names of a metric family of type typ (as the text format or
// the protobuf enum names it): a histogram's _bucket, _sum and _count, a summary's _sum and
// _count.
func addFamily(names map[string]bool, name, typ string) {
	names[name] = true
	switch strings.ToLower(typ) {
	case "histogram", "gauge_histogram", "gaugehistogram":
		names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
	case "summary":
		names[name+"_sum"], names[name+"_count"] = true, true
	}
}

// textFamilies adds the families of a Prometheus text exposition, by its TYPE lines.
func textFamilies(t *testing.T, text string, names map[string]bool) {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			addFamily(names, f[2], f[3])
		}
	}
	require.NoError(t, sc.Err())
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []struct {
			Name string `json:"name"`
			Expr string `json:"expr"`
		} `json:"list"`
	} `json:"annotations"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	GridPos    struct{ H, W, X, Y int }
	Targets    []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(data, &d), dashboardFile)
	return d
}

type dashboardExpr struct{ where, expr string }

var labelValuesRE = regexp.MustCompile(`^label_values\((.+),\s*[A-Za-z_][A-Za-z0-9_]*\)$`)

// dashboardExprs returns every PromQL expression of the dashboard: panel targets,
// annotations and the metrics of query variables.
func dashboardExprs(d dashboard) []dashboardExpr {
	var out []dashboardExpr
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out = append(out, dashboardExpr{fmt.Sprintf("panel %q target %s", p.Title, tg.RefID), tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, a := range d.Annotations.List {
		if a.Expr != "" {
			out = append(out, dashboardExpr{"annotation " + a.Name, a.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) != nil {
			_ = json.Unmarshal(v.Query, &q.Query) // a plain string
		}
		if mm := labelValuesRE.FindStringSubmatch(q.Query); mm != nil {
			out = append(out, dashboardExpr{"variable " + v.Name, mm[1]})
		}
	}
	return out
}
