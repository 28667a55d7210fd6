package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sliceplane/sliceplane/client/pgwriter"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/internal/faultproxy"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/source/postgres"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgcluster"
)

// TestChaosPostgres runs the chaos suite on a cluster whose items are in a PostgreSQL table:
// the faults of CHAOS_PG_FAULTS (a fast restart of the server; the server unreachable
// through a fault proxy that drops every byte, for twice the assigners' lease). Each must
// keep the assigner's term, lose nothing and answer no read wrong; an outage must fire
// SliceplaneSourceUnavailable (checked with promtool against the series the suite scraped,
// where promtool is installed) and clear it after.
func TestChaosPostgres(t *testing.T) {
	if err := pgcluster.Installed(); err != nil {
		t.Skipf("needs a PostgreSQL server: %v", err)
	}
	runChaos(t, sourcePostgres)
}

// pgFaults are the faults of the data source, for a run on PostgreSQL.
var pgFaults = []fault{
	{"pg-restart", "source", pgRestart},
	{"pg-outage", "source", pgOutage},
}

// postgresSource is the run's PostgreSQL: a throwaway server, and the fault proxy every
// assigner and distributor reaches it through. The application (the writer) and the checker
// reach it directly.
type postgresSource struct {
	server *pgcluster.Cluster
	proxy  *faultproxy.Proxy
}

// startPostgres starts the server in dir/postgres with the items table, the proxy, the
// writer and the checker's source, and gives the cluster the flags that read it.
func (r *run) startPostgres(dir string) {
	t := r.t
	server, err := pgcluster.Start(r.ctx, filepath.Join(dir, "postgres"), pgcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Stop() }) //nolint:errcheck // a throwaway server
	if err := postgres.Init(r.ctx, postgres.Config{DSN: server.DSN}); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(server.DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() }) //nolint:errcheck // the test is ending
	u.Host = proxy.Addr()
	r.c.sourceArgs = []string{"--source", "postgres", "--pg-dsn", u.String()}
	src, err := postgres.Open(r.ctx, postgres.Config{DSN: server.DSN})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	w, err := pgwriter.Open(r.ctx, pgwriter.Config{DSN: server.DSN})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	r.src, r.w, r.pg = src, w, &postgresSource{server: server, proxy: proxy}
}

// pgRestart restarts the server as a minor-version upgrade does (pg_ctl restart -m fast).
func pgRestart(r *run) (outcome, error) {
	mon := r.monitorSource()
	err := r.pg.server.Restart(r.ctx, "fast")
	return r.sourceBack(outcome{target: "fast restart"}, mon, time.Time{}, err)
}

// pgOutage makes the server unreachable to every assigner and distributor for twice the
// assigners' lease: the proxy drops every byte, resets nothing, and takes new connections
// that go nowhere, as a link that blackholes does. The application writes on meanwhile.
func pgOutage(r *run) (outcome, error) {
	mon := r.monitorSource()
	r.pg.proxy.Stall()
	start := time.Now()
	err := r.hold(2 * r.cfg.sessionTTL)
	r.pg.proxy.Resume()
	return r.sourceBack(outcome{target: fmt.Sprintf("unreachable %s", 2*r.cfg.sessionTTL)}, mon, start, err)
}

// etcdSourceCut cuts one distributor off etcd, the source of a run on etcd (its etcd links
// only: the assigners and the application still reach it), for twice the assigners' lease.
// Unlike a database, this source is also where the distributor registers: its registration
// lapses meanwhile and its nodes move to the other distributor, and back once it returns.
func etcdSourceCut(r *run) (outcome, error) {
	d := r.pick(r.c.distributors)
	var ps []*toxiproxy.Proxy
	for _, e := range r.c.etcd {
		ps = append(ps, r.c.proxies["etcd-"+d.id+"-"+e.id])
	}
	mon := r.monitorSource()
	start := time.Now()
	err := r.cut(ps, 2*r.cfg.sessionTTL)
	return r.sourceBack(outcome{target: d.id + " cut off etcd " + (2 * r.cfg.sessionTTL).String()}, mon, start, err)
}

// sourceBack measures the recovery of a source fault that just ended (err its own error),
// and, for an outage that began at out (zero for a restart), checks that the alert fired
// during it and cleared after.
func (r *run) sourceBack(o outcome, mon *sourceMonitor, out time.Time, err error) (outcome, error) {
	back := time.Now()
	if err == nil {
		o.recovered, err = r.recovery(back)
	}
	if err == nil {
		err = mon.settle(r.ctx, r.cfg.patience)
	}
	series := mon.stop()
	if err == nil && !out.IsZero() {
		err = r.checkAlert(series, out, back)
	}
	return o, err
}

// recovery waits from back, the source's return, until every live node is fresh and holds
// the first write the application made after it, and returns how long that took.
func (r *run) recovery(back time.Time) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.patience)
	defer cancel()
	err := launch.WaitFor(ctx, "every node fresh with the writes after the source's return", 20*time.Millisecond, func(ctx context.Context) error {
		mark, ok := r.probes.writtenAfter(back)
		if !ok {
			return errors.New("no write since the source's return")
		}
		for _, n := range r.c.nodes {
			st, err := kvclient.New(n.addr, r.c.http).State(ctx)
			switch {
			case err != nil:
				return err
			case !st.Fresh:
				return fmt.Errorf("node %s is not fresh: %s", n.id, st.StaleReason)
			case st.Clock < mark.rev:
				return fmt.Errorf("node %s is at %d, the write after the return at %d", n.id, st.Clock, mark.rev)
			}
		}
		return nil
	})
	return time.Since(back), err
}

// sourceMonitor scrapes sliceplane_{assigner,distributor}_source_available of every
// assigner and distributor while a source fault runs, as Prometheus would.
type sourceMonitor struct {
	start  time.Time
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	series map[string][]sample // by "job instance"
}

type sample struct {
	at    time.Time
	value float64
}

// monitorSource starts scraping every 250 ms until stop.
func (r *run) monitorSource() *sourceMonitor {
	ctx, cancel := context.WithCancel(r.ctx)
	m := &sourceMonitor{start: time.Now(), cancel: cancel, series: map[string][]sample{}}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: r.c.tls.ClientTLS()}, Timeout: time.Second}
	targets := append(slices.Clone(r.c.assigners), r.c.distributors...)
	m.wg.Go(func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			for _, tg := range targets {
				if v, err := scrapeAvailable(ctx, client, tg); err == nil {
					m.add("sliceplane-"+tg.kind+" "+tg.name(), v)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	return m
}

func (m *sourceMonitor) add(key string, v float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.series[key] = append(m.series[key], sample{at: time.Now(), value: v})
}

// settle waits until every process scraped says the source is available, then two seconds
// more, so that the series show the alert's end.
func (m *sourceMonitor) settle(ctx context.Context, patience time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	var since time.Time
	return launch.WaitFor(ctx, "every process to say the source is available", 100*time.Millisecond, func(context.Context) error {
		m.mu.Lock()
		defer m.mu.Unlock()
		for key, ss := range m.series {
			if ss[len(ss)-1].value != 1 {
				since = time.Time{}
				return fmt.Errorf("%s says the source is unavailable", key)
			}
		}
		if since.IsZero() {
			since = time.Now()
		}
		if time.Since(since) < 2*time.Second {
			return errors.New("settling")
		}
		return nil
	})
}

// stop ends the scraping and returns what it saw.
func (m *sourceMonitor) stop() *sourceMonitor {
	m.cancel()
	m.wg.Wait()
	return m
}

// scrapeAvailable reads m's source_available gauge from its /metrics.
func scrapeAvailable(ctx context.Context, c *http.Client, m *member) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+m.metrics+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("chaos: %s /metrics: %s", m.name(), resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, err
	}
	f := families["sliceplane_"+m.kind+"_source_available"]
	if f == nil || len(f.GetMetric()) == 0 {
		return 0, fmt.Errorf("chaos: %s exports no source_available", m.name())
	}
	return f.GetMetric()[0].GetGauge().GetValue(), nil
}

// checkAlert checks that SliceplaneSourceUnavailable fired during the outage [out, back) and
// that nothing fires at the end of the scraped series: with promtool, by evaluating the
// project's rules over the series at one sample a second; without it, by the rule's meaning
// (some process said 0 for the rule's 5 s, and every one says 1 at the end).
func (r *run) checkAlert(m *sourceMonitor, out, back time.Time) error {
	if path, err := exec.LookPath("promtool"); err == nil {
		return r.promtoolAlert(path, m, out, back)
	}
	fired, clear := false, true
	for _, ss := range m.series {
		var zeroSince time.Time
		for _, s := range ss {
			switch {
			case s.value != 0:
				zeroSince = time.Time{}
			case zeroSince.IsZero():
				zeroSince = s.at
			case s.at.Sub(zeroSince) >= 5*time.Second && s.at.Before(back):
				fired = true
			}
		}
		clear = clear && len(ss) > 0 && ss[len(ss)-1].value == 1
	}
	if !fired || !clear {
		return fmt.Errorf("chaos: SliceplaneSourceUnavailable: fired during the outage %t, clear after it %t", fired, clear)
	}
	return nil
}

// promtoolAlert writes the scraped series as a promtool unit test of the rules and runs it.
func (r *run) promtoolAlert(promtool string, m *sourceMonitor, out, back time.Time) error {
	secs := int(time.Since(m.start) / time.Second)
	var b strings.Builder
	rules, err := filepath.Abs("../deploy/prometheus/rules.yml")
	if err != nil {
		return err
	}
	fmt.Fprintf(&b, "rule_files:\n  - %s\nevaluation_interval: 1s\ntests:\n  - interval: 1s\n    input_series:\n", rules)
	for _, key := range slices.Sorted(maps.Keys(m.series)) {
		job, instance, _ := strings.Cut(key, " ")
		strs := make([]string, secs+1)
		for k := range strs {
			strs[k] = "_"
			at := m.start.Add(time.Duration(k) * time.Second)
			for _, s := range m.series[key] { // the last scrape at or before the second, as Prometheus holds it
				if !s.at.After(at) {
					strs[k] = fmt.Sprint(s.value)
				}
			}
		}
		fmt.Fprintf(&b, "      - series: 'sliceplane_%s_source_available{job=%q, instance=%q}'\n        values: '%s'\n",
			strings.TrimPrefix(job, "sliceplane-"), job, instance, strings.Join(strs, " "))
	}
	during, end := int(back.Sub(m.start)/time.Second), secs
	window := int(back.Sub(out)/time.Second) + 1
	const firing = `ALERTS{alertname="SliceplaneSourceUnavailable", alertstate="firing"}`
	fmt.Fprintf(&b, "    promql_expr_test:\n")
	fmt.Fprintf(&b, "      - expr: 'clamp_max(count(max_over_time(%s[%ds])), 1)'\n        eval_time: %ds\n        exp_samples:\n          - value: 1\n", firing, window, during)
	fmt.Fprintf(&b, "      - expr: 'count(%s) or vector(0)'\n        eval_time: %ds\n        exp_samples:\n          - value: 0\n", firing, end)
	file := filepath.Join(r.c.dir, fmt.Sprintf("alert-%d_test.yml", m.start.UnixNano()))
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		return err
	}
	if outp, err := launch.CombinedOutput(exec.CommandContext(r.ctx, promtool, "test", "rules", file)); err != nil {
		return fmt.Errorf("chaos: SliceplaneSourceUnavailable over the scraped series (%s): %w\n%s", file, err, outp)
	}
	return nil
}
