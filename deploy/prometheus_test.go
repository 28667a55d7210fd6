package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/certs"
)

func TestPrometheusConfig(t *testing.T) {
	cfg := readYAML(t, prometheusFile)[0]
	_, err := time.ParseDuration(s(cfg, "global", "scrape_interval"))
	assert.NoError(t, err, "global.scrape_interval")
	for _, f := range strs(l(cfg, "rule_files")) {
		_, err := os.Stat(filepath.Join(filepath.Dir(prometheusFile), f))
		assert.NoError(t, err, "rule file %s (relative to %s)", f, prometheusFile)
	}
	var jobs []string
	for _, sc := range l(cfg, "scrape_configs") {
		job := s(sc, "job_name")
		assert.NotContains(t, jobs, job, "job %s twice", job)
		jobs = append(jobs, job)
		assert.NotEmpty(t, l(sc, "static_configs"), "job %s has no targets", job)
	}
	for _, job := range []string{"sliceplane-assigner", "sliceplane-distributor"} {
		assert.Contains(t, jobs, job, "the rules and the dashboard expect job %s", job)
	}
}

func TestAlertingRules(t *testing.T) {
	doc := readYAML(t, rulesFile)[0]
	var alerts []string
	for _, g := range l(doc, "groups") {
		require.NotEmpty(t, s(g, "name"))
		for _, r := range l(g, "rules") {
			alert, record := s(r, "alert"), s(r, "record")
			require.True(t, (alert == "") != (record == ""), "a rule is an alert or a recording rule: %v", r)
			assert.NotEmpty(t, strings.TrimSpace(s(r, "expr")), "%s%s: expr", alert, record)
			if record != "" {
				assert.Regexp(t, `^[a-z_]+:[a-z_]+:[a-z_]+$`, record, "recording rules are named level:metric:operations")
				continue
			}
			alerts = append(alerts, alert)
			assert.Regexp(t, `^Sliceplane[A-Za-z]+$`, alert)
			assert.Contains(t, []string{"critical", "warning", "info"}, s(r, "labels", "severity"), "%s: severity", alert)
			assert.NotEmpty(t, s(r, "annotations", "summary"), "%s: summary", alert)
			assert.NotEmpty(t, s(r, "annotations", "description"), "%s: description", alert)
			if f := s(r, "for"); f != "" {
				_, err := time.ParseDuration(f)
				assert.NoError(t, err, "%s: for", alert)
			}
		}
	}
	// What the deployment promises to alert on.
	for _, want := range []string{"SliceplaneImbalanceHigh", "SliceplaneDistributorLagHigh", "SliceplaneNoAssignerLeader", "SliceplaneAssignerDown"} {
		assert.Contains(t, alerts, want)
	}
	imbalance := ruleNamed(t, doc, "SliceplaneImbalanceHigh")
	assert.Equal(t, "10m", s(imbalance, "for"), "imbalance high for 10 minutes")
}

func ruleNamed(t *testing.T, doc map[string]any, alert string) map[string]any {
	t.Helper()
	for _, g := range l(doc, "groups") {
		for _, r := range l(g, "rules") {
			if s(r, "alert") == alert {
				return m(r)
			}
		}
	}
	t.Fatalf("no alert %s", alert)
	return nil
}

// promtool returns the path of promtool, or skips the test.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not on PATH (Debian: apt-get install prometheus); skipping its checks")
	}
	return p
}

func runPromtool(t *testing.T, args ...string) {
	t.Helper()
	t.Parallel()
	out, err := exec.Command(promtool(t), args...).CombinedOutput()
	assert.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
}

// TestPromtoolCheckConfig checks the compose Prometheus's configuration, with the
// certificate files it names (in the certs volume, /certs) made by a development CA in a
// scratch directory: promtool loads them.
func TestPromtoolCheckConfig(t *testing.T) {
	promtool(t)
	dir := t.TempDir()
	ca, err := certs.NewCA("test", time.Hour)
	require.NoError(t, err)
	require.NoError(t, certs.WriteCA(filepath.Join(dir, "certs"), ca))
	req := certs.Request{Kind: "viewer", Name: "prometheus"}
	leaf, err := ca.Issue(req)
	require.NoError(t, err)
	_, err = certs.WriteLeaf(filepath.Join(dir, "certs"), req, leaf)
	require.NoError(t, err)
	cfg, err := os.ReadFile(prometheusFile)
	require.NoError(t, err)
	require.Contains(t, string(cfg), "/certs/")
	cfg = []byte(strings.ReplaceAll(string(cfg), "/certs/", filepath.Join(dir, "certs")+"/"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), cfg, 0o600))
	rules, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(rulesFile)), rules, 0o600))
	runPromtool(t, "check", "config", filepath.Join(dir, "prometheus.yml"))
}

func TestPromtoolCheckRules(t *testing.T) { runPromtool(t, "check", "rules", rulesFile) }

// TestPromtoolTestRules runs the alerting rules' unit tests (prometheus/rules_test.yml, and
// rules_source_test.yml at a second's resolution).
func TestPromtoolTestRules(t *testing.T) {
	runPromtool(t, "test", "rules", rulesTestFile, sourceRulesTest)
}

// TestPromtoolCheckDashboardQueries parses every PromQL expression of the dashboard, as
// recording rules in a scratch file, with Grafana's variables replaced by plain values.
func TestPromtoolCheckDashboardQueries(t *testing.T) {
	t.Parallel()
	promtool(t)
	exprs := dashboardExprs(loadDashboard(t))
	require.NotEmpty(t, exprs)
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	r := strings.NewReplacer("$__rate_interval", "1m", "$__interval", "1m", "$__range", "1h", "$distributor", ".*", "$target", "default")
	for i, e := range exprs {
		q, _ := json.Marshal(r.Replace(e.expr))
		fmt.Fprintf(&b, "      - record: dashboard:expr_%d:check\n        expr: %s\n", i, q)
		assert.NotContains(t, r.Replace(e.expr), "$", "%s: a Grafana variable this test does not know", e.where)
	}
	path := filepath.Join(t.TempDir(), "dashboard_rules.yml")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
	out, err := exec.Command(promtool(t), "check", "rules", path).CombinedOutput()
	assert.NoError(t, err, "promtool check rules on the dashboard's queries:\n%s", out)
}

func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	assert.Equal(t, "sliceplane-overview", d.UID)
	assert.NotEmpty(t, d.Title)
	assert.GreaterOrEqual(t, d.SchemaVersion, 36)
	ids := map[int]bool{}
	var titles []string
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			assert.False(t, ids[p.ID], "panel id %d twice", p.ID)
			ids[p.ID] = true
			assert.NotEmpty(t, p.Title, "panel %d has no title", p.ID)
			titles = append(titles, p.Title)
			assert.True(t, p.GridPos.W > 0 && p.GridPos.H > 0 && p.GridPos.X+p.GridPos.W <= 24, "panel %q: gridPos %+v", p.Title, p.GridPos)
			if p.Type != "row" {
				assert.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
				assert.JSONEq(t, `{"type":"prometheus","uid":"${datasource}"}`, string(p.Datasource), "panel %q: datasource", p.Title)
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				assert.NotEmpty(t, tg.Expr, "panel %q: empty query", p.Title)
				assert.False(t, refs[tg.RefID], "panel %q: refId %s twice", p.Title, tg.RefID)
				refs[tg.RefID] = true
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	// What the dashboard promises to show.
	for _, want := range []string{"Imbalance over time", "Load per node", "Churn per pass", "Quanta by cause",
		"Source lag", "Queue depth per node", "Snapshots (total)"} {
		assert.True(t, slices.Contains(titles, want), "no panel %q", want)
	}
	var names []string
	for _, v := range d.Templating.List {
		names = append(names, v.Name)
	}
	assert.Contains(t, names, "datasource")
}
