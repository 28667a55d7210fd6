package deploy_test

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/authz"
)

// k8sContainer is one container of a workload's pod template.
type k8sContainer struct {
	w      k8sObject
	pod    map[string]any // the pod template
	c      map[string]any
	binary string
	args   []string
}

func (c k8sContainer) String() string { return fmt.Sprintf("%s container %s", c.w, s(c.c, "name")) }

func containersOf(objects []k8sObject) []k8sContainer {
	var out []k8sContainer
	for _, w := range ofKind(objects, "StatefulSet", "Deployment") {
		pod := m(w.doc, "spec", "template")
		for _, c := range l(pod, "spec", "containers") {
			out = append(out, k8sContainer{w: w, pod: pod, c: m(c), binary: imageBinary(s(c, "image")), args: strs(l(c, "args"))})
		}
	}
	return out
}

// volumeOf returns the pod volume a file of the container is in (nil if none), and the
// file's name within it.
func (c k8sContainer) volumeOf(file string) (map[string]any, string) {
	for _, vm := range l(c.c, "volumeMounts") {
		dir := s(vm, "mountPath")
		if rel, ok := strings.CutPrefix(file, strings.TrimSuffix(dir, "/")+"/"); ok {
			for _, v := range l(c.pod, "spec", "volumes") {
				if s(v, "name") == s(vm, "name") {
					return m(v), rel
				}
			}
		}
	}
	return nil, ""
}

// pki is what pki.yaml sets up: the CA's issuer and the certificates by Secret name.
type pki struct {
	caIssuer string
	bySecret map[string]map[string]any // Certificate spec by secretName
}

var spiffeRE = regexp.MustCompile(`^spiffe://sliceplane/([a-z]+)/([A-Za-z0-9._${}-]+)$`)

// loadPKI checks the chain self-signed Issuer → CA Certificate → CA Issuer and returns it.
func loadPKI(t *testing.T, objects []k8sObject) pki {
	t.Helper()
	issuers := map[string]k8sObject{}
	for _, o := range ofKind(objects, "Issuer") {
		issuers[o.name()] = o
	}
	p := pki{bySecret: map[string]map[string]any{}}
	var caSecret string
	for _, c := range ofKind(objects, "Certificate") {
		spec := m(c.doc, "spec")
		issuer, ok := issuers[s(spec, "issuerRef", "name")]
		require.True(t, ok, "%s: no Issuer %s", c, s(spec, "issuerRef", "name"))
		assert.Equal(t, "Issuer", s(spec, "issuerRef", "kind"), "%s: issuerRef.kind", c)
		if s(spec, "isCA") == "true" {
			require.Empty(t, caSecret, "%s: a second CA", c)
			caSecret = s(spec, "secretName")
			assert.NotNil(t, m(issuer.doc, "spec", "selfSigned"), "%s: the CA is signed by the bootstrap self-signed Issuer", c)
			continue
		}
		p.bySecret[s(spec, "secretName")] = spec
	}
	require.NotEmpty(t, caSecret, "no CA Certificate (isCA: true)")
	for _, i := range issuers {
		if s(i.doc, "spec", "ca", "secretName") == caSecret {
			p.caIssuer = i.name()
		}
	}
	require.NotEmpty(t, p.caIssuer, "no Issuer signs with the CA's Secret %s", caSecret)
	for secret, spec := range p.bySecret {
		where := "Certificate of Secret " + secret
		assert.Equal(t, p.caIssuer, s(spec, "issuerRef", "name"), "%s: issued by the CA", where)
		uris := strs(l(spec, "uris"))
		if assert.Len(t, uris, 1, "%s: one identity", where) {
			assert.Regexp(t, spiffeRE, uris[0], where)
		}
		assert.Contains(t, strs(l(spec, "usages")), "client auth", "%s: every identity is a client", where)
	}
	return p
}

// identity is what a container's certificate says: its SPIFFE ID, DNS names and the files
// its volume holds.
type identity struct {
	id        string
	dnsNames  []string
	files     []string
	serverTLS bool
}

// identityOf follows a certificate file of a container to the Certificate or csi-driver
// volume that makes it.
func identityOf(t *testing.T, p pki, c k8sContainer, file string) (identity, bool) {
	t.Helper()
	vol, name := c.volumeOf(file)
	if !assert.NotNil(t, vol, "%s: %s is on no mounted volume", c, file) {
		return identity{}, false
	}
	if secret := s(vol, "secret", "secretName"); secret != "" {
		spec, ok := p.bySecret[secret]
		if !assert.True(t, ok, "%s: Secret %s is no Certificate's", c, secret) {
			return identity{}, false
		}
		id := identity{dnsNames: strs(l(spec, "dnsNames")), files: []string{"tls.crt", "tls.key", "ca.crt"},
			serverTLS: slices.Contains(strs(l(spec, "usages")), "server auth")}
		if uris := strs(l(spec, "uris")); len(uris) > 0 {
			id.id = uris[0]
		}
		assert.Contains(t, id.files, name, "%s: %s is not a file of the Secret", c, file)
		return id, true
	}
	attrs := m(vol, "csi", "volumeAttributes")
	if !assert.Equal(t, "csi.cert-manager.io", s(vol, "csi", "driver"), "%s: %s: neither a Certificate's Secret nor cert-manager's csi-driver", c, file) {
		return identity{}, false
	}
	assert.Equal(t, p.caIssuer, s(attrs, "csi.cert-manager.io/issuer-name"), "%s: csi-driver issuer", c)
	id := identity{
		id:       s(attrs, "csi.cert-manager.io/uri-sans"),
		dnsNames: strings.Split(s(attrs, "csi.cert-manager.io/dns-names"), ","),
		files: []string{s(attrs, "csi.cert-manager.io/certificate-file"), s(attrs, "csi.cert-manager.io/privatekey-file"),
			s(attrs, "csi.cert-manager.io/ca-file")},
		serverTLS: strings.Contains(s(attrs, "csi.cert-manager.io/key-usages"), "server auth"),
	}
	assert.Contains(t, id.files, name, "%s: %s is not a file the csi-driver writes", c, file)
	return id, true
}

// TestKubernetesMutualTLS checks that every Sliceplane process runs with a certificate from
// the CA naming the identity its role needs (a node's naming its own --id), that the probes
// present it, that the authz policy is mounted and valid, and that etcd wants client
// certificates and is reached over https.
func TestKubernetesMutualTLS(t *testing.T) {
	objects, _ := loadKubernetes(t)
	p := loadPKI(t, objects)
	configMaps := map[string]map[string]any{}
	for _, cm := range ofKind(objects, "ConfigMap") {
		configMaps[cm.name()] = m(cm.doc, "data")
	}
	kinds := map[string]string{"assigner": "assigner", "distributor": "distributor", "kvnode": "node"}
	seen := map[string]bool{}
	for _, c := range containersOf(objects) {
		kind, ok := kinds[c.binary]
		if !ok {
			continue
		}
		seen[c.binary] = true
		cert, key, ca := tlsFiles(c.args)
		id, ok := identityOf(t, p, c, cert)
		if !ok {
			continue
		}
		for _, f := range []string{key, ca} {
			vol, _ := c.volumeOf(f)
			certVol, _ := c.volumeOf(cert)
			assert.Equal(t, certVol, vol, "%s: %s is not next to %s", c, f, cert)
		}
		mm := spiffeRE.FindStringSubmatch(id.id)
		if assert.NotNil(t, mm, "%s: identity %q", c, id.id) {
			assert.Equal(t, kind, mm[1], "%s: a %s acts as a %s", c, c.binary, kind)
			if kind == "node" {
				// A node may act only as itself: the certificate names the pod, which is its --id.
				idFlag, _ := flagValue(c.args, "id")
				assert.Equal(t, "${POD_NAME}", mm[2], "%s: one certificate per pod", c)
				assert.Equal(t, "$(POD_NAME)", idFlag, "%s: --id is the pod name its certificate names", c)
			}
		}
		assert.True(t, id.serverTLS, "%s: serves, so its certificate needs server auth", c)
		assert.NotContains(t, flagArgs(c.args), "insecure", "%s: --insecure", c)
		checkProbesTLS(t, c, cert, key, ca)
		if c.binary == "assigner" || c.binary == "distributor" {
			policy, ok := flagValue(c.args, "authz-policy")
			if assert.True(t, ok, "%s: --authz-policy", c) {
				vol, name := c.volumeOf(policy)
				data, ok := configMaps[s(vol, "configMap", "name")]
				if assert.True(t, ok, "%s: --authz-policy %s is in no ConfigMap", c, policy) {
					_, err := authz.ParsePolicy([]byte(s(data, name)))
					assert.NoError(t, err, "%s: the policy", c)
				}
			}
		}
	}
	assert.Len(t, seen, len(kinds), "assigner, distributor and kvnode containers checked")
	checkKubernetesEtcdTLS(t, p, objects)
}

// checkProbesTLS checks that a container's exec probes present its own certificate.
func checkProbesTLS(t *testing.T, c k8sContainer, cert, key, ca string) {
	t.Helper()
	for _, probe := range []string{"readinessProbe", "livenessProbe"} {
		cmd := strs(l(c.c, probe, "exec", "command"))
		if !assert.NotEmpty(t, cmd, "%s: %s: an exec probe (the kubelet's cannot present a certificate)", c, probe) {
			continue
		}
		var args []string
		for _, a := range cmd {
			args = append(args, "-"+a)
		}
		pc, pk, pca := tlsFiles(args)
		assert.Equal(t, []string{cert, key, ca}, []string{pc, pk, pca}, "%s: %s presents the container's certificate", c, probe)
		if cmd[1] == "http" {
			assert.True(t, strings.HasPrefix(cmd[2], "https://"), "%s: %s over https", c, probe)
		}
	}
}

// checkKubernetesEtcdTLS checks etcd's TLS flags and that its certificate is valid for the
// names its peers and clients use.
func checkKubernetesEtcdTLS(t *testing.T, p pki, objects []k8sObject) {
	t.Helper()
	found := false
	for _, c := range containersOf(objects) {
		if c.binary != "etcd" {
			continue
		}
		found = true
		for _, f := range []string{"client-cert-auth", "peer-client-cert-auth"} {
			assert.Contains(t, flagArgs(c.args), f, "%s: without --%s etcd admits anyone", c, f)
		}
		cert, _ := flagValue(c.args, "cert-file")
		id, ok := identityOf(t, p, c, cert)
		if !ok {
			continue
		}
		assert.Regexp(t, spiffeRE, id.id, "%s: Sliceplane's etcd clients want a sliceplane identity", c)
		for _, f := range []string{"key-file", "trusted-ca-file", "peer-cert-file", "peer-key-file", "peer-trusted-ca-file"} {
			v, _ := flagValue(c.args, f)
			vol, _ := c.volumeOf(v)
			certVol, _ := c.volumeOf(cert)
			assert.Equal(t, certVol, vol, "%s: --%s", c, f)
		}
		checkProbesTLS(t, c, cert, must(flagValue(c.args, "key-file")), must(flagValue(c.args, "trusted-ca-file")))
		// The initial cluster is every member of the StatefulSet, by its stable name.
		replicas, err := strconv.Atoi(s(c.w.doc, "spec", "replicas"))
		require.NoError(t, err)
		var members []string
		for i := range replicas {
			pod := fmt.Sprintf("%s-%d", c.w.name(), i)
			members = append(members, fmt.Sprintf("%s=https://%s.%s.$(POD_NAMESPACE).svc:2380", pod, pod, s(c.w.doc, "spec", "serviceName")))
		}
		assert.Equal(t, strings.Join(members, ","), must(flagValue(c.args, "initial-cluster")), "%s: --initial-cluster", c)
		for _, f := range []string{"listen-client-urls", "advertise-client-urls", "listen-peer-urls", "initial-advertise-peer-urls", "initial-cluster"} {
			v, _ := flagValue(c.args, f)
			for _, u := range strings.Split(v, ",") {
				if _, after, named := strings.Cut(u, "="); named {
					u = after
				}
				assert.True(t, strings.HasPrefix(u, "https://"), "%s: --%s %s", c, f, u)
				if host := hostOf(u); f != "listen-client-urls" && f != "listen-peer-urls" {
					host = strings.NewReplacer("$(POD_NAME)", c.w.name()+"-0", "$(POD_NAMESPACE)", c.w.namespace()).Replace(host)
					assert.True(t, coveredBy(id.dnsNames, host), "%s: --%s: the certificate is not valid for %s", c, f, host)
				}
			}
		}
	}
	assert.True(t, found, "no etcd container")
}

func must(v string, _ bool) string { return v }

func hostOf(u string) string {
	u = strings.TrimPrefix(strings.TrimPrefix(u, "https://"), "http://")
	host, _, _ := strings.Cut(u, ":")
	return host
}

// coveredBy reports whether a certificate with dnsNames is valid for host (a "*." name
// covers one label).
func coveredBy(dnsNames []string, host string) bool {
	for _, n := range dnsNames {
		if n == host {
			return true
		}
		if rest, ok := strings.CutPrefix(n, "*"); ok && strings.HasSuffix(host, rest) {
			if label := strings.TrimSuffix(host, rest); label != "" && !strings.Contains(label, ".") {
				return true
			}
		}
	}
	return false
}

// TestKubernetesScrapesOverTLS checks that the ServiceMonitors scrape over https with
// Prometheus's viewer certificate and check a name the scraped pods' certificates have.
func TestKubernetesScrapesOverTLS(t *testing.T) {
	objects, _ := loadKubernetes(t)
	p := loadPKI(t, objects)
	for _, sm := range ofKind(objects, "ServiceMonitor") {
		selector := labels(m(sm.doc, "spec", "selector", "matchLabels"))
		var podSelector map[string]string
		for _, svc := range ofKind(objects, "Service") {
			if selects(selector, labels(m(svc.doc, "metadata", "labels"))) {
				podSelector = labels(m(svc.doc, "spec", "selector"))
			}
		}
		matched, _ := podsOf(objects, podSelector)
		require.Len(t, matched, 1, "%s", sm)
		var server identity
		for _, c := range containersOf(objects) {
			if c.w.String() == matched[0].String() {
				cert, _, _ := tlsFiles(c.args)
				server, _ = identityOf(t, p, c, cert)
			}
		}
		for _, e := range l(sm.doc, "spec", "endpoints") {
			assert.Equal(t, "https", s(e, "scheme"), "%s: scheme", sm)
			tc := m(e, "tlsConfig")
			secrets := []string{s(tc, "ca", "secret", "name"), s(tc, "cert", "secret", "name"), s(tc, "keySecret", "name")}
			for _, secret := range secrets {
				spec, ok := p.bySecret[secret]
				if assert.True(t, ok, "%s: Secret %q is no Certificate's", sm, secret) {
					assert.Regexp(t, `^spiffe://sliceplane/viewer/`, s(l(spec, "uris")[0]), "%s: Prometheus is a viewer", sm)
				}
			}
			assert.Equal(t, []string{"ca.crt", "tls.crt", "tls.key"},
				[]string{s(tc, "ca", "secret", "key"), s(tc, "cert", "secret", "key"), s(tc, "keySecret", "key")}, "%s: keys", sm)
			name := strings.ReplaceAll(s(tc, "serverName"), "sliceplane.svc", "${POD_NAMESPACE}.svc")
			assert.True(t, coveredBy(server.dnsNames, s(tc, "serverName")) || slices.Contains(server.dnsNames, name),
				"%s: serverName %s is not in the certificate of %s (%v)", sm, s(tc, "serverName"), matched[0], server.dnsNames)
		}
	}
}

// TestKubernetesNetworkPolicies checks that every workload is behind one NetworkPolicy and
// that the policies admit the expected peers and only those.
func TestKubernetesNetworkPolicies(t *testing.T) {
	objects, _ := loadKubernetes(t)
	policies := ofKind(objects, "NetworkPolicy")
	byApp := map[string]k8sObject{}
	for _, w := range ofKind(objects, "StatefulSet", "Deployment") {
		podLabels := labels(m(w.doc, "spec", "template", "metadata", "labels"))
		var covering []k8sObject
		for _, np := range policies {
			if selects(labels(m(np.doc, "spec", "podSelector", "matchLabels")), podLabels) {
				covering = append(covering, np)
			}
		}
		if assert.Len(t, covering, 1, "%s: NetworkPolicies selecting its pods", w) {
			assert.Equal(t, []string{"Ingress"}, strs(l(covering[0].doc, "spec", "policyTypes")), "%s", covering[0])
			_, ports := podsOf(objects, podLabels)
			for _, rule := range l(covering[0].doc, "spec", "ingress") {
				for _, p := range l(rule, "ports") {
					assert.True(t, ports[s(p, "port")], "%s: port %s is no container port of %s", covering[0], s(p, "port"), w)
				}
			}
		}
		byApp[podLabels["app.kubernetes.io/name"]] = w
	}
	pod := func(app string) peer {
		w, ok := byApp[app]
		require.True(t, ok, "no workload %s", app)
		return peer{labels: labels(m(w.doc, "spec", "template", "metadata", "labels")), namespace: "sliceplane"}
	}
	prometheus := peer{labels: map[string]string{"app.kubernetes.io/name": "prometheus"}, namespace: "monitoring"}
	admin := peer{labels: map[string]string{}, namespace: "ops", nsLabels: map[string]string{"sliceplane.io/admin": "true"}}
	router := peer{labels: map[string]string{"sliceplane.io/client": "router"}, namespace: "app"}
	writer := peer{labels: map[string]string{"sliceplane.io/client": "writer"}, namespace: "app"}
	stranger := peer{labels: map[string]string{"app": "web"}, namespace: "app"}
	cases := []struct {
		from     peer
		to, port string
		admit    bool
		fromName string
	}{
		{pod("sliceplane-distributor"), "sliceplane-assigner", "grpc", true, "distributor"},
		{pod("kvnode"), "sliceplane-assigner", "grpc", true, "node"},
		{router, "sliceplane-assigner", "grpc", true, "router"},
		{admin, "sliceplane-assigner", "grpc", true, "slicectl"},
		{pod("sliceplane-assigner"), "sliceplane-assigner", "grpc", true, "assigner"},
		{prometheus, "sliceplane-assigner", "metrics", true, "prometheus"},
		{prometheus, "sliceplane-assigner", "grpc", false, "prometheus"},
		{stranger, "sliceplane-assigner", "grpc", false, "stranger"},
		{pod("kvnode"), "sliceplane-distributor", "grpc", true, "node"},
		{prometheus, "sliceplane-distributor", "metrics", true, "prometheus"},
		{router, "sliceplane-distributor", "grpc", false, "router"},
		{pod("kvnode"), "sliceplane-distributor", "metrics", false, "node"},
		{pod("sliceplane-assigner"), "sliceplane-etcd", "client", true, "assigner"},
		{pod("sliceplane-distributor"), "sliceplane-etcd", "client", true, "distributor"},
		{writer, "sliceplane-etcd", "client", true, "writer"},
		{pod("sliceplane-etcd"), "sliceplane-etcd", "peer", true, "etcd"},
		{pod("kvnode"), "sliceplane-etcd", "client", false, "node"},
		{prometheus, "sliceplane-etcd", "client", false, "prometheus"},
		{pod("sliceplane-assigner"), "sliceplane-etcd", "peer", false, "assigner"},
		{router, "kvnode", "http", true, "router"},
		{prometheus, "kvnode", "http", true, "prometheus"},
		{stranger, "kvnode", "http", false, "stranger"},
	}
	for _, tc := range cases {
		to := labels(m(byApp[tc.to].doc, "spec", "template", "metadata", "labels"))
		got := admits(policies, tc.from, to, tc.port)
		assert.Equal(t, tc.admit, got, "%s → %s:%s admitted", tc.fromName, tc.to, tc.port)
	}
}

// peer is a pod trying to connect: its labels, namespace and namespace labels.
type peer struct {
	labels    map[string]string
	namespace string
	nsLabels  map[string]string
}

// admits reports whether the policies selecting the pod labelled to admit from on port
// (a port name). Only what the manifests use is understood: matchLabels selectors, named
// ports, pods in the policy's namespace when no namespaceSelector is given.
func admits(policies []k8sObject, from peer, to map[string]string, port string) bool {
	for _, np := range policies {
		if !selects(labels(m(np.doc, "spec", "podSelector", "matchLabels")), to) {
			continue
		}
		for _, rule := range l(np.doc, "spec", "ingress") {
			var ports []string
			for _, p := range l(rule, "ports") {
				ports = append(ports, s(p, "port"))
			}
			if !slices.Contains(ports, port) {
				continue
			}
			for _, f := range l(rule, "from") {
				if peerMatches(np, m(f), from) {
					return true
				}
			}
		}
	}
	return false
}

func peerMatches(np k8sObject, from map[string]any, p peer) bool {
	ns, hasNS := from["namespaceSelector"]
	if hasNS {
		nsSel := labels(m(ns, "matchLabels"))
		for k, v := range nsSel {
			if p.nsLabels[k] != v {
				return false
			}
		}
	} else if p.namespace != np.namespace() {
		return false
	}
	podSel, hasPod := from["podSelector"]
	if !hasPod {
		return true
	}
	return selects(labels(m(podSel, "matchLabels")), p.labels)
}
