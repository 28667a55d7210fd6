package deploy_test

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// composeService is what the tests need of a compose service.
type composeService struct {
	name    string
	binary  string   // of the image, "" if not ours
	args    []string // command, or the entrypoint's arguments for tools
	raw     map[string]any
	profile bool // started only on demand (profiles)
}

func loadCompose(t *testing.T) (map[string]any, map[string]composeService) {
	t.Helper()
	docs := readYAML(t, composeFile)
	require.Len(t, docs, 1)
	doc := docs[0]
	services := map[string]composeService{}
	for name, v := range m(doc, "services") {
		svc := composeService{name: name, raw: m(v), binary: imageBinary(s(v, "image")), profile: len(l(v, "profiles")) > 0}
		svc.args = strs(l(v, "command"))
		if ep := strs(l(v, "entrypoint")); len(ep) > 0 {
			svc.args = append(ep[1:], svc.args...)
		}
		services[name] = svc
	}
	require.NotEmpty(t, services)
	return doc, services
}

// byBinary returns the names of the services (profiles excluded) running binary, sorted.
func byBinary(services map[string]composeService, binary string) []string {
	var out []string
	for name, svc := range services {
		if svc.binary == binary && !svc.profile {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func TestComposeStackShape(t *testing.T) {
	doc, services := loadCompose(t)
	// What the stack promises: a 3-member etcd, a leader and a standby, two distributors,
	// four nodes and Prometheus.
	for binary, n := range map[string]int{"etcd": 3, "assigner": 2, "distributor": 2, "kvnode": 4, "prometheus": 1} {
		assert.Len(t, byBinary(services, binary), n, "services running %s", binary)
	}
	require.Contains(t, m(doc, "networks"), "sliceplane")
	assert.Equal(t, "bridge", s(doc, "networks", "sliceplane", "driver"), "a user-defined bridge network")
	volumes := m(doc, "volumes")
	for name, svc := range services {
		where := "service " + name
		image := s(svc.raw, "image")
		_, tag, _ := strings.Cut(image, ":")
		assert.Equal(t, "${SLICEPLANE_TAG:-dev}", tag, "%s: image tag", where)
		assert.NotEmpty(t, svc.binary, "%s: image %q is not one of ours", where, image)
		assert.True(t, binaryBuilt(svc.binary), "%s: build-images.sh builds no %s", where, svc.binary)
		assert.Equal(t, []string{"sliceplane"}, strs(l(svc.raw, "networks")), "%s: networks", where)
		for _, p := range strs(l(svc.raw, "ports")) {
			assert.True(t, strings.HasPrefix(p, "127.0.0.1:"), "%s: port %q is not published on 127.0.0.1 only", where, p)
		}
		for dep := range m(svc.raw, "depends_on") {
			assert.Contains(t, services, dep, "%s: depends on an unknown service", where)
		}
		for _, v := range strs(l(svc.raw, "volumes")) {
			src, _, _ := strings.Cut(v, ":")
			if strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") {
				_, err := os.Stat(filepath.Join(filepath.Dir(composeFile), src))
				assert.NoError(t, err, "%s: bind mount source %s", where, src)
			} else {
				assert.Contains(t, volumes, src, "%s: volume %s is not declared", where, src)
			}
		}
		if oneShot(services, name) {
			assert.Empty(t, s(svc.raw, "restart"), "%s: a one-shot service is not restarted", where)
			continue
		}
		if hc := strs(l(svc.raw, "healthcheck", "test")); len(hc) > 0 {
			require.GreaterOrEqual(t, len(hc), 4, "%s: healthcheck %v", where, hc)
			assert.Equal(t, []string{"CMD", "/usr/local/bin/probe"}, hc[:2], "%s: healthchecks run the probe baked into the image", where)
			assert.Contains(t, []string{"http", "grpc"}, hc[2], "%s: probe kind", where)
		} else if !svc.profile {
			t.Errorf("%s: no healthcheck", where)
		}
	}
}

// oneShot reports whether the others wait for service name to complete (the certificates):
// it runs once and exits, so it has no health check.
func oneShot(services map[string]composeService, name string) bool {
	for _, svc := range services {
		if s(svc.raw, "depends_on", name, "condition") == "service_completed_successfully" {
			return true
		}
	}
	return false
}

// binaryBuilt reports whether build-images.sh builds an image for binary.
func binaryBuilt(binary string) bool {
	switch binary {
	case "etcd", "prometheus":
		return true
	}
	for _, dir := range []string{"../cmd/", "../examples/kvstore/cmd/"} {
		if _, err := os.Stat(filepath.Join(dir, binary, "main.go")); err == nil {
			return true
		}
	}
	return false
}

func TestComposeFlagsExist(t *testing.T) {
	_, services := loadCompose(t)
	checked := 0
	for name, svc := range services {
		if _, ok := commands[svc.binary]; ok {
			checkFlags(t, "compose service "+name, svc.binary, svc.args)
			checked++
		}
	}
	assert.Equal(t, 6, checked, "assigners, distributors, the slicectl tool and the certs service checked")
}

// TestComposeAddressesAgree follows every address a process is given to the service that
// should answer there: advertised names, assigner lists, etcd endpoints, the etcd cluster's
// members and Prometheus's scrape targets.
func TestComposeAddressesAgree(t *testing.T) {
	_, services := loadCompose(t)
	// listens[service] are the ports the service serves on.
	listens := map[string][]string{}
	addListen := func(svc, addr string) {
		_, port := splitHostPort(t, "service "+svc, addr)
		listens[svc] = append(listens[svc], port)
	}
	for name, svc := range services {
		for _, flag := range []string{"listen", "metrics-listen", "web.listen-address"} {
			if v, ok := flagValue(svc.args, flag); ok {
				addListen(name, v)
			}
		}
		if v, ok := flagValue(svc.args, "listen-client-urls"); ok {
			u, err := url.Parse(v)
			require.NoError(t, err)
			addListen(name, u.Host)
		}
	}
	serves := func(where, host, port, binary string) {
		t.Helper()
		svc, ok := services[host]
		if !assert.True(t, ok, "%s: %s is no service", where, host) {
			return
		}
		if binary != "" {
			assert.Equal(t, binary, svc.binary, "%s: %s runs the wrong binary", where, host)
		}
		assert.Contains(t, listens[host], port, "%s: %s does not listen on %s", where, host, port)
	}

	for name, svc := range services {
		where := "service " + name
		if v, ok := flagValue(svc.args, "advertise"); ok {
			host, port := splitHostPort(t, where+" --advertise", v)
			assert.Equal(t, name, host, "%s advertises another name", where)
			serves(where+" --advertise", host, port, svc.binary)
		} else if svc.binary == "assigner" || svc.binary == "distributor" || svc.binary == "kvnode" {
			t.Errorf("%s: no --advertise (it listens on a wildcard address)", where)
		}
		if v, ok := flagValue(svc.args, "assigners"); ok {
			var hosts []string
			for _, a := range strings.Split(v, ",") {
				host, port := splitHostPort(t, where+" --assigners", a)
				serves(where+" --assigners", host, port, "assigner")
				hosts = append(hosts, host)
			}
			slices.Sort(hosts)
			assert.Equal(t, byBinary(services, "assigner"), hosts, "%s: --assigners must name every assigner", where)
		}
		if v, ok := flagValue(svc.args, "etcd-endpoints"); ok {
			var hosts []string
			for _, e := range strings.Split(v, ",") {
				u, err := url.Parse(e)
				require.NoError(t, err, where)
				serves(where+" --etcd-endpoints", u.Hostname(), u.Port(), "etcd")
				hosts = append(hosts, u.Hostname())
			}
			slices.Sort(hosts)
			assert.Equal(t, byBinary(services, "etcd"), hosts, "%s: --etcd-endpoints must name every member", where)
		}
		if v, ok := flagValue(svc.args, "id"); ok && svc.binary == "distributor" {
			for other, o := range services {
				if ov, _ := flagValue(o.args, "id"); other != name && o.binary == svc.binary && ov == v {
					t.Errorf("%s and %s share --id %s", name, other, v)
				}
			}
		}
	}

	checkEtcdMembersAgree(t, services)
	checkPrometheusScrapesEveryProcess(t, services)
}

// checkEtcdMembersAgree checks that the etcd members name themselves and each other
// consistently.
func checkEtcdMembersAgree(t *testing.T, services map[string]composeService) {
	var members []string
	for _, name := range byBinary(services, "etcd") {
		args := services[name].args
		n, _ := flagValue(args, "name")
		assert.Equal(t, name, n, "etcd service %s: --name", name)
		peer, _ := flagValue(args, "initial-advertise-peer-urls")
		members = append(members, n+"="+peer)
		client, _ := flagValue(args, "advertise-client-urls")
		assert.Equal(t, "https://"+name+":2379", client, "etcd service %s: --advertise-client-urls", name)
	}
	for _, name := range byBinary(services, "etcd") {
		cluster, _ := flagValue(services[name].args, "initial-cluster")
		assert.Equal(t, strings.Join(members, ","), cluster, "etcd service %s: --initial-cluster", name)
	}

}

// checkPrometheusScrapesEveryProcess checks that Prometheus scrapes every process that serves
// metrics, where it serves them.
func checkPrometheusScrapesEveryProcess(t *testing.T, services map[string]composeService) {
	metricsPort := map[string]string{}
	for name, svc := range services {
		switch svc.binary {
		case "assigner", "distributor":
			v, ok := flagValue(svc.args, "metrics-listen")
			require.True(t, ok, "service %s: no --metrics-listen", name)
			_, metricsPort[name] = splitHostPort(t, name, v)
		case "kvnode":
			v, _ := flagValue(svc.args, "listen")
			_, metricsPort[name] = splitHostPort(t, name, v)
		case "etcd":
			metricsPort[name] = "2379"
		}
	}
	scraped := map[string]bool{}
	for _, sc := range l(readYAML(t, prometheusFile)[0], "scrape_configs") {
		job := s(sc, "job_name")
		for _, st := range l(sc, "static_configs") {
			for _, target := range strs(l(st, "targets")) {
				host, port := splitHostPort(t, "scrape job "+job, target)
				if host == "localhost" {
					continue // Prometheus itself
				}
				scraped[host] = true
				assert.Equal(t, metricsPort[host], port, "scrape job %s: %s serves its metrics elsewhere", job, host)
			}
		}
	}
	for name := range metricsPort {
		if !services[name].profile {
			assert.True(t, scraped[name], "prometheus.yml does not scrape %s", name)
		}
	}
}

func TestComposeToolsAndMounts(t *testing.T) {
	_, services := loadCompose(t)
	prom, ok := services["prometheus"]
	require.True(t, ok)
	config, _ := flagValue(prom.args, "config.file")
	assert.Equal(t, "/etc/prometheus/prometheus.yml", config)
	assert.Contains(t, strs(l(prom.raw, "volumes")), "../prometheus:/etc/prometheus:ro",
		"the compose Prometheus reads deploy/prometheus")
	for _, tool := range []string{"kvload", "slicectl"} {
		svc, ok := services[tool]
		if assert.True(t, ok, "no %s tool service", tool) {
			assert.True(t, svc.profile, "%s: a tool, run on demand, not started by up", tool)
			ep := strs(l(svc.raw, "entrypoint"))
			if assert.NotEmpty(t, ep, "%s: an entrypoint presetting the cluster's addresses", tool) {
				assert.Equal(t, "/entrypoint", ep[0], tool)
				for _, a := range ep[1:] {
					assert.True(t, strings.HasPrefix(a, "--") && strings.Contains(a, "="), "%s: entrypoint argument %q is not one --flag=value", tool, a)
				}
			}
		}
	}
	for _, name := range byBinary(services, "kvnode") {
		dir, _ := flagValue(services[name].args, "data-dir")
		assert.Contains(t, strs(l(services[name].raw, "volumes")), fmt.Sprintf("%s:%s", name, dir),
			"service %s keeps --data-dir on its own volume", name)
	}
}
