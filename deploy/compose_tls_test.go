package deploy_test

import (
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/authz"
)

// composeCerts is what the compose stack's certs service makes: the files it writes, by
// path under the mount point of the others (/certs), and the host names of its server
// certificates.
type composeCerts struct {
	files map[string]bool
	hosts []string
}

// certsMount is where every service but certs finds the certificates.
const certsMount = "/certs"

// loadComposeCerts reads the certs service's slicectl certs init command line.
func loadComposeCerts(t *testing.T, services map[string]composeService) composeCerts {
	t.Helper()
	svc, ok := services["certs"]
	require.True(t, ok, "no certs service")
	require.Equal(t, "slicectl", svc.binary, "certs runs slicectl certs init")
	require.GreaterOrEqual(t, len(svc.args), 3)
	require.Equal(t, []string{"certs", "init"}, svc.args[:2])
	dir := svc.args[2]
	assert.Contains(t, strs(l(svc.raw, "volumes")), "certs:"+dir, "certs writes into the volume certs")
	c := composeCerts{files: map[string]bool{certsMount + "/ca.crt": true}}
	for _, kind := range []string{"assigner", "distributor", "node", "etcd", "router", "viewer", "admin"} {
		v, ok := flagValue(svc.args, kind)
		if !ok {
			continue
		}
		for _, name := range strings.Split(v, ",") {
			base := fmt.Sprintf("%s/%s-%s", certsMount, kind, name)
			c.files[base+".crt"], c.files[base+".key"] = true, true
		}
	}
	if v, ok := flagValue(svc.args, "host"); ok {
		c.hosts = strings.Split(v, ",")
	}
	return c
}

// tlsFiles returns the --tls-cert, --tls-key and --tls-ca of a command line ("" if
// missing).
func tlsFiles(args []string) (cert, key, ca string) {
	cert, _ = flagValue(args, "tls-cert")
	key, _ = flagValue(args, "tls-key")
	ca, _ = flagValue(args, "tls-ca")
	return cert, key, ca
}

// TestComposeMutualTLS checks that every process of the stack runs with certificates the
// certs service makes, of the identity its role needs, and waits for them; that etcd wants
// client certificates from its clients and peers; that health checks present certificates;
// and that nothing is left plaintext (--insecure, http:// endpoints).
func TestComposeMutualTLS(t *testing.T) {
	_, services := loadCompose(t)
	certs := loadComposeCerts(t, services)
	made := func(where, file string) {
		t.Helper()
		assert.True(t, certs.files[file], "%s: %s is not made by the certs service", where, file)
	}
	// The kind each binary's certificate must name: the role it acts in.
	kinds := map[string]string{"assigner": "assigner", "distributor": "distributor", "kvnode": "node", "kvload": "router", "slicectl": "admin"}
	for name, svc := range services {
		where := "service " + name
		if name == "certs" {
			continue
		}
		// Tools run on demand once the stack is up: depending on certs would run it again.
		if !svc.profile {
			assert.Equal(t, "service_completed_successfully", s(svc.raw, "depends_on", "certs", "condition"),
				"%s: waits for the certificates", where)
		}
		if svc.binary != "etcd" && svc.binary != "prometheus" {
			assert.NotContains(t, flagArgs(svc.args), "insecure", "%s: --insecure", where)
		}
		if svc.binary == "prometheus" || svc.binary == "etcd" || kinds[svc.binary] != "" {
			assert.Contains(t, strs(l(svc.raw, "volumes")), "certs:"+certsMount+":ro", "%s: mounts the certificates read-only", where)
		}
		if kind := kinds[svc.binary]; kind != "" {
			cert, key, ca := tlsFiles(svc.args)
			made(where+" --tls-cert", cert)
			made(where+" --tls-key", key)
			made(where+" --tls-ca", ca)
			assert.Equal(t, strings.TrimSuffix(cert, ".crt"), strings.TrimSuffix(key, ".key"), "%s: --tls-key is not --tls-cert's", where)
			id, _ := flagValue(svc.args, "id")
			want := kind + "-"
			if (kind == "node" || kind == "distributor") && id != "" {
				// A node may act only as the node its certificate names.
				want += id + ".crt"
				assert.Equal(t, certsMount+"/"+want, cert, "%s: the certificate must name --id %s", where, id)
			} else {
				assert.True(t, strings.HasPrefix(path.Base(cert), want), "%s: %s is not a %s identity", where, cert, kind)
			}
		}
		for _, flag := range []string{"etcd-endpoints", "listen-client-urls", "advertise-client-urls", "listen-peer-urls", "initial-advertise-peer-urls", "initial-cluster"} {
			if v, ok := flagValue(svc.args, flag); ok {
				for _, u := range strings.Split(v, ",") {
					if _, after, named := strings.Cut(u, "="); named {
						u = after // --initial-cluster's name=url
					}
					assert.True(t, strings.HasPrefix(u, "https://"), "%s: --%s %s is not https", where, flag, u)
				}
			}
		}
		if svc.binary == "etcd" {
			for _, f := range []string{"client-cert-auth", "peer-client-cert-auth"} {
				assert.Contains(t, flagArgs(svc.args), f, "%s: etcd without --%s admits anyone", where, f)
			}
			for _, f := range []string{"cert-file", "key-file", "trusted-ca-file", "peer-cert-file", "peer-key-file", "peer-trusted-ca-file"} {
				v, _ := flagValue(svc.args, f)
				made(where+" --"+f, v)
			}
			assert.Contains(t, certs.hosts, name, "%s: etcd's peers check its host name", where)
		}
		checkComposeHealthTLS(t, where, svc, made)
		if policy, ok := flagValue(svc.args, "authz-policy"); ok {
			checkComposePolicy(t, where, svc, policy)
		} else if svc.binary == "assigner" {
			t.Errorf("%s: no --authz-policy", where)
		}
	}
	checkPrometheusScrapesOverTLS(t, certs, made)
}

// checkPrometheusScrapesOverTLS checks that Prometheus scrapes over https, as a viewer, and
// checks the host names of what it scrapes.
func checkPrometheusScrapesOverTLS(t *testing.T, certs composeCerts, made func(where, file string)) {
	for _, sc := range l(readYAML(t, prometheusFile)[0], "scrape_configs") {
		job := s(sc, "job_name")
		if job == "prometheus" {
			continue
		}
		assert.Equal(t, "https", s(sc, "scheme"), "scrape job %s", job)
		for _, f := range []string{"ca_file", "cert_file", "key_file"} {
			made("scrape job "+job+" tls_config."+f, s(sc, "tls_config", f))
		}
		assert.True(t, strings.HasPrefix(path.Base(s(sc, "tls_config", "cert_file")), "viewer-"), "scrape job %s: Prometheus is a viewer", job)
		for _, st := range l(sc, "static_configs") {
			for _, target := range strs(l(st, "targets")) {
				host, _ := splitHostPort(t, "scrape job "+job, target)
				assert.Contains(t, certs.hosts, host, "scrape job %s: the certificates are not valid for %s", job, host)
			}
		}
	}
}

// checkComposePolicy checks that an --authz-policy file is bind-mounted from this directory
// and is a valid policy.
func checkComposePolicy(t *testing.T, where string, svc composeService, policy string) {
	t.Helper()
	for _, v := range strs(l(svc.raw, "volumes")) {
		src, rest, _ := strings.Cut(v, ":")
		if dst, _, _ := strings.Cut(rest, ":"); dst == policy {
			_, err := authz.LoadPolicy(filepath.Join(filepath.Dir(composeFile), src))
			assert.NoError(t, err, "%s: --authz-policy", where)
			return
		}
	}
	t.Errorf("%s: --authz-policy %s is not mounted", where, policy)
}

// checkComposeHealthTLS checks that a health check against a TLS server presents a
// certificate the certs service makes, and talks https to HTTP servers.
func checkComposeHealthTLS(t *testing.T, where string, svc composeService, made func(string, string)) {
	t.Helper()
	hc := strs(l(svc.raw, "healthcheck", "test"))
	if len(hc) < 4 || svc.binary == "prometheus" {
		return
	}
	var args []string
	for _, a := range hc[4:] {
		args = append(args, "-"+a) // the probe's flags are Go's -flag=value
	}
	cert, key, ca := tlsFiles(args)
	made(where+" healthcheck -tls-cert", cert)
	made(where+" healthcheck -tls-key", key)
	made(where+" healthcheck -tls-ca", ca)
	if hc[2] == "http" {
		u, err := url.Parse(hc[3])
		if assert.NoError(t, err, where) {
			assert.Equal(t, "https", u.Scheme, "%s: healthcheck %s", where, hc[3])
		}
	}
	if own, _ := flagValue(svc.args, "tls-cert"); own != "" {
		assert.Equal(t, own, cert, "%s: the health check presents the service's own certificate", where)
	}
}

// TestComposeCertsCoverEveryServer checks that the certificates name every host a client
// reaches by name, and nothing the stack does not have.
func TestComposeCertsCoverEveryServer(t *testing.T) {
	_, services := loadCompose(t)
	certs := loadComposeCerts(t, services)
	var servers []string
	for _, b := range []string{"etcd", "assigner", "distributor", "kvnode"} {
		servers = append(servers, byBinary(services, b)...)
	}
	slices.Sort(servers)
	hosts := slices.Clone(certs.hosts)
	slices.Sort(hosts)
	assert.Equal(t, servers, hosts, "certs --host: every server's service name")
}
