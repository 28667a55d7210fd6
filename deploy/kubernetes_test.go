package deploy_test

import (
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// k8sObject is one Kubernetes document and the file it is in.
type k8sObject struct {
	file string
	doc  map[string]any
}

func (o k8sObject) kind() string      { return s(o.doc, "kind") }
func (o k8sObject) name() string      { return s(o.doc, "metadata", "name") }
func (o k8sObject) namespace() string { return s(o.doc, "metadata", "namespace") }
func (o k8sObject) String() string {
	return fmt.Sprintf("%s %s/%s (%s)", o.kind(), o.namespace(), o.name(), o.file)
}

// loadKubernetes returns every object of the manifests under deploy/kubernetes, and the
// kustomizations apart.
func loadKubernetes(t *testing.T) (objects, kustomizations []k8sObject) {
	t.Helper()
	for _, f := range yamlFiles(t, kubernetesDir) {
		for _, doc := range readYAML(t, f) {
			o := k8sObject{file: f, doc: doc}
			if o.kind() == "Kustomization" {
				kustomizations = append(kustomizations, o)
			} else {
				objects = append(objects, o)
			}
		}
	}
	return objects, kustomizations
}

func ofKind(objects []k8sObject, kinds ...string) []k8sObject {
	var out []k8sObject
	for _, o := range objects {
		if slices.Contains(kinds, o.kind()) {
			out = append(out, o)
		}
	}
	return out
}

// labels turns a YAML map of labels into strings.
func labels(v map[string]any) map[string]string {
	out := map[string]string{}
	for k, x := range v {
		out[k] = s(x)
	}
	return out
}

// selects reports whether a non-empty selector matches the labels.
func selects(selector, lbls map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if lbls[k] != v {
			return false
		}
	}
	return true
}

// apiVersions of the kinds the manifests may use.
var apiVersions = map[string]string{
	"Namespace": "v1", "ConfigMap": "v1", "ServiceAccount": "v1", "Service": "v1",
	"StatefulSet": "apps/v1", "Deployment": "apps/v1", "PodDisruptionBudget": "policy/v1",
	"ServiceMonitor": "monitoring.coreos.com/v1", "PrometheusRule": "monitoring.coreos.com/v1",
	"Issuer": "cert-manager.io/v1", "Certificate": "cert-manager.io/v1",
	"NetworkPolicy": "networking.k8s.io/v1",
}

var dnsLabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func TestKubernetesObjectsWellFormed(t *testing.T) {
	objects, _ := loadKubernetes(t)
	seen := map[string]bool{}
	for _, o := range objects {
		want, known := apiVersions[o.kind()]
		if !assert.True(t, known, "%s: unexpected kind", o) {
			continue
		}
		assert.Equal(t, want, s(o.doc, "apiVersion"), "%s: apiVersion", o)
		assert.Regexp(t, dnsLabelRE, o.name(), "%s: metadata.name", o)
		assert.LessOrEqual(t, len(o.name()), 63, "%s: metadata.name too long", o)
		if o.kind() != "Namespace" {
			assert.Equal(t, "sliceplane", o.namespace(), "%s: namespace", o)
		}
		key := o.kind() + "/" + o.namespace() + "/" + o.name()
		assert.False(t, seen[key], "%s: defined twice", o)
		seen[key] = true
		for k := range m(o.doc) {
			assert.Contains(t, []string{"apiVersion", "kind", "metadata", "spec", "data", "automountServiceAccountToken"}, k, "%s: top-level field", o)
		}
	}
	assert.True(t, seen["Namespace//sliceplane"], "the namespace is created")
}

func TestKubernetesKustomizationsListEveryFile(t *testing.T) {
	_, kustomizations := loadKubernetes(t)
	require.NotEmpty(t, kustomizations)
	listed := map[string]bool{}
	for _, k := range kustomizations {
		dir := filepath.Dir(k.file)
		for _, r := range strs(l(k.doc, "resources")) {
			path := filepath.Join(dir, r)
			_, err := os.Stat(path)
			assert.NoError(t, err, "%s lists %s", k.file, r)
			listed[path] = true
		}
	}
	for _, f := range yamlFiles(t, kubernetesDir) {
		if filepath.Base(f) != "kustomization.yaml" {
			assert.True(t, listed[f], "%s is in no kustomization.yaml", f)
		}
	}
}

func TestKubernetesWorkloads(t *testing.T) {
	objects, _ := loadKubernetes(t)
	services := ofKind(objects, "Service")
	configMaps := map[string]map[string]any{}
	for _, cm := range ofKind(objects, "ConfigMap") {
		configMaps[cm.name()] = m(cm.doc, "data")
	}
	serviceAccounts := map[string]bool{}
	for _, sa := range ofKind(objects, "ServiceAccount") {
		serviceAccounts[sa.name()] = true
	}
	workloads := ofKind(objects, "StatefulSet", "Deployment")
	require.NotEmpty(t, workloads)
	binaries := map[string]bool{}
	for _, w := range workloads {
		pod := m(w.doc, "spec", "template")
		podLabels := labels(m(pod, "metadata", "labels"))
		selector := labels(m(w.doc, "spec", "selector", "matchLabels"))
		assert.True(t, selects(selector, podLabels), "%s: selector %v does not match the pod labels %v", w, selector, podLabels)
		if sa := s(pod, "spec", "serviceAccountName"); sa != "" {
			assert.True(t, serviceAccounts[sa], "%s: no ServiceAccount %s", w, sa)
		}
		if w.kind() == "StatefulSet" {
			// The governing Service exists, is headless and selects these pods.
			name := s(w.doc, "spec", "serviceName")
			var gov k8sObject
			for _, svc := range services {
				if svc.name() == name {
					gov = svc
				}
			}
			if assert.NotNil(t, gov.doc, "%s: no Service %s", w, name) {
				assert.Equal(t, "None", s(gov.doc, "spec", "clusterIP"), "%s: Service %s is not headless", w, name)
				assert.True(t, selects(labels(m(gov.doc, "spec", "selector")), podLabels), "%s: Service %s does not select its pods", w, name)
			}
		}
		assert.Equal(t, "RuntimeDefault", s(pod, "spec", "securityContext", "seccompProfile", "type"), "%s: seccomp", w)
		assert.Equal(t, "true", s(pod, "spec", "securityContext", "runAsNonRoot"), "%s: runAsNonRoot", w)

		for _, c := range l(pod, "spec", "containers") {
			where := fmt.Sprintf("%s container %s", w, s(c, "name"))
			binary := imageBinary(s(c, "image"))
			assert.NotEmpty(t, binary, "%s: image %q is not one of ours", where, s(c, "image"))
			binaries[binary] = true
			args := strs(l(c, "args"))
			checkFlags(t, where, binary, args)
			checkContainerVars(t, where, c, args, configMaps)
			checkContainerPorts(t, where, c, args)
			assert.Equal(t, "false", s(c, "securityContext", "allowPrivilegeEscalation"), "%s: allowPrivilegeEscalation", where)
			assert.Equal(t, []string{"ALL"}, strs(l(c, "securityContext", "capabilities", "drop")), "%s: capabilities", where)
			assert.NotEmpty(t, s(c, "resources", "requests", "memory"), "%s: memory request", where)
		}
	}
	assert.True(t, binaries["assigner"] && binaries["distributor"], "the assigner and distributor workloads exist")
}

// checkContainerVars checks that every $(VAR) in the arguments is defined, by env or by a
// ConfigMap's key.
func checkContainerVars(t *testing.T, where string, c any, args []string, configMaps map[string]map[string]any) {
	defined := map[string]bool{}
	for _, e := range l(c, "env") {
		defined[s(e, "name")] = true
	}
	for _, ef := range l(c, "envFrom") {
		name := s(ef, "configMapRef", "name")
		data, ok := configMaps[name]
		if assert.True(t, ok, "%s: no ConfigMap %s", where, name) {
			for k := range data {
				defined[k] = true
			}
		}
	}
	for _, a := range args {
		for _, ref := range varRefRE.FindAllStringSubmatch(a, -1) {
			assert.True(t, defined[ref[1]], "%s: $(%s) is not defined", where, ref[1])
		}
	}
}

// checkContainerPorts checks that probes and listening flags name the container's ports.
func checkContainerPorts(t *testing.T, where string, c any, args []string) {
	ports := map[string]string{}
	for _, p := range l(c, "ports") {
		ports[s(p, "name")] = s(p, "containerPort")
	}
	for _, probe := range []string{"readinessProbe", "livenessProbe"} {
		pr := m(c, probe)
		if !assert.NotNil(t, pr, "%s: no %s", where, probe) {
			continue
		}
		port := s(pr, "grpc", "port")
		if port == "" {
			port = s(pr, "httpGet", "port")
		}
		if cmd := strs(l(pr, "exec", "command")); len(cmd) > 0 {
			port = execProbePort(t, where+" "+probe, cmd)
		}
		assert.True(t, ports[port] != "" || slices.Contains(slices.Collect(maps.Values(ports)), port),
			"%s: %s probes port %s, which the container does not declare", where, probe, port)
	}
	for _, flag := range []string{"listen", "metrics-listen"} {
		if v, ok := flagValue(args, flag); ok {
			_, port := splitHostPort(t, where+" --"+flag, v)
			assert.Contains(t, slices.Collect(maps.Values(ports)), port, "%s: --%s port is not a containerPort", where, flag)
		}
	}
}

// execProbePort returns the port an exec probe asks: the image's probe, against the
// container's own loopback address.
func execProbePort(t *testing.T, where string, cmd []string) string {
	t.Helper()
	if !assert.GreaterOrEqual(t, len(cmd), 3, "%s: %v", where, cmd) {
		return ""
	}
	assert.Equal(t, "/usr/local/bin/probe", cmd[0], "%s: exec probes run the image's probe", where)
	target := cmd[2]
	if u, err := url.Parse(target); err == nil && u.Host != "" {
		target = u.Host
	}
	host, port := splitHostPort(t, where, target)
	assert.Equal(t, "127.0.0.1", host, "%s: probes the container itself", where)
	return port
}

var varRefRE = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// podsOf returns the pod labels and container ports (name and number) of the workloads a
// selector matches.
func podsOf(objects []k8sObject, selector map[string]string) (matched []k8sObject, ports map[string]bool) {
	ports = map[string]bool{}
	for _, w := range ofKind(objects, "StatefulSet", "Deployment") {
		pod := m(w.doc, "spec", "template")
		if !selects(selector, labels(m(pod, "metadata", "labels"))) {
			continue
		}
		matched = append(matched, w)
		for _, c := range l(pod, "spec", "containers") {
			for _, p := range l(c, "ports") {
				ports[s(p, "name")] = true
				ports[s(p, "containerPort")] = true
			}
		}
	}
	return matched, ports
}

func TestKubernetesServicesPDBsAndMonitors(t *testing.T) {
	objects, _ := loadKubernetes(t)
	for _, svc := range ofKind(objects, "Service") {
		matched, ports := podsOf(objects, labels(m(svc.doc, "spec", "selector")))
		if !assert.NotEmpty(t, matched, "%s selects no workload's pods", svc) {
			continue
		}
		for _, p := range l(svc.doc, "spec", "ports") {
			target := s(p, "targetPort")
			if target == "" {
				target = s(p, "port")
			}
			assert.True(t, ports[target], "%s: port %s targets %s, which no selected container declares", svc, s(p, "name"), target)
		}
	}
	for _, pdb := range ofKind(objects, "PodDisruptionBudget") {
		matched, _ := podsOf(objects, labels(m(pdb.doc, "spec", "selector", "matchLabels")))
		if assert.Len(t, matched, 1, "%s selects no workload, or several", pdb) {
			replicas, _ := strconv.Atoi(s(matched[0].doc, "spec", "replicas"))
			unavailable, _ := strconv.Atoi(s(pdb.doc, "spec", "maxUnavailable"))
			assert.True(t, unavailable >= 1 && unavailable < replicas, "%s: maxUnavailable %d of %d replicas", pdb, unavailable, replicas)
		}
	}
	monitored := map[string]bool{}
	for _, sm := range ofKind(objects, "ServiceMonitor") {
		selector := labels(m(sm.doc, "spec", "selector", "matchLabels"))
		var matched []k8sObject
		for _, svc := range ofKind(objects, "Service") {
			if selects(selector, labels(m(svc.doc, "metadata", "labels"))) {
				matched = append(matched, svc)
			}
		}
		if !assert.Len(t, matched, 1, "%s must select exactly one Service (its name is the job label)", sm) {
			continue
		}
		monitored[matched[0].name()] = true
		var portNames []string
		for _, p := range l(matched[0].doc, "spec", "ports") {
			portNames = append(portNames, s(p, "name"))
		}
		for _, e := range l(sm.doc, "spec", "endpoints") {
			assert.Contains(t, portNames, s(e, "port"), "%s: endpoint port", sm)
			assert.Equal(t, "/metrics", s(e, "path"), "%s: endpoint path", sm)
		}
	}
	// The alerting rules name jobs; each is a monitored Service.
	for _, job := range []string{"sliceplane-assigner", "sliceplane-distributor"} {
		assert.True(t, monitored[job], "no ServiceMonitor yields job %q, which the rules use", job)
	}
}

func TestKubernetesAssignerAddresses(t *testing.T) {
	objects, _ := loadKubernetes(t)
	var assigners k8sObject
	for _, w := range ofKind(objects, "StatefulSet") {
		if imageBinary(s(l(w.doc, "spec", "template", "spec", "containers")[0], "image")) == "assigner" {
			assigners = w
		}
	}
	require.NotNil(t, assigners.doc, "no assigner StatefulSet")
	replicas, err := strconv.Atoi(s(assigners.doc, "spec", "replicas"))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, replicas, 2, "a leader and a standby")
	// ASSIGNERS names every assigner pod by its stable name, at its gRPC port.
	var want []string
	for i := range replicas {
		want = append(want, fmt.Sprintf("%s-%d.%s:7070", assigners.name(), i, s(assigners.doc, "spec", "serviceName")))
	}
	var cm k8sObject
	for _, o := range ofKind(objects, "ConfigMap") {
		if o.name() == "sliceplane-config" {
			cm = o
		}
	}
	require.NotNil(t, cm.doc)
	assert.Equal(t, strings.Join(want, ","), s(cm.doc, "data", "ASSIGNERS"))
	// etcd.yaml's members, by their stable names, over TLS.
	var etcd k8sObject
	for _, w := range ofKind(objects, "StatefulSet") {
		if imageBinary(s(l(w.doc, "spec", "template", "spec", "containers")[0], "image")) == "etcd" {
			etcd = w
		}
	}
	require.NotNil(t, etcd.doc, "no etcd StatefulSet")
	members, err := strconv.Atoi(s(etcd.doc, "spec", "replicas"))
	require.NoError(t, err)
	var endpoints []string
	for i := range members {
		endpoints = append(endpoints, fmt.Sprintf("https://%s-%d.%s.%s.svc:2379", etcd.name(), i, s(etcd.doc, "spec", "serviceName"), etcd.namespace()))
	}
	assert.Equal(t, strings.Join(endpoints, ","), s(cm.doc, "data", "ETCD_ENDPOINTS"))
	assert.True(t, strings.HasSuffix(s(cm.doc, "data", "SLICEPLANE_PREFIX"), "/"), "SLICEPLANE_PREFIX ends in /")
}

func TestKubernetesPrometheusRuleMatchesRulesFile(t *testing.T) {
	objects, _ := loadKubernetes(t)
	rules := ofKind(objects, "PrometheusRule")
	require.Len(t, rules, 1)
	file := readYAML(t, rulesFile)[0]
	assert.Equal(t, l(file, "groups"), l(rules[0].doc, "spec", "groups"),
		"the PrometheusRule in %s must hold the groups of %s", rules[0].file, rulesFile)
}

// TestKustomizeBuild renders the kustomizations with kubectl's built-in kustomize, when
// kubectl is on PATH (it needs no cluster for this; apply --dry-run would).
func TestKustomizeBuild(t *testing.T) {
	t.Parallel()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not on PATH; skipping kubectl kustomize")
	}
	objects, kustomizations := loadKubernetes(t)
	for _, k := range kustomizations {
		dir := filepath.Dir(k.file)
		out, err := exec.Command(kubectl, "kustomize", dir).CombinedOutput()
		if !assert.NoError(t, err, "kubectl kustomize %s:\n%s", dir, out) {
			continue
		}
		want := 0
		for _, o := range objects {
			if filepath.Dir(o.file) == dir {
				want++
			}
		}
		assert.Equal(t, want, strings.Count("\n"+string(out), "\nkind: "), "kubectl kustomize %s: objects rendered", dir)
	}
}

// TestKubernetesKvnodeDrainsWithinItsGracePeriod checks that a kvnode pod is given the time
// to drain before it is killed: its grace period covers --drain-timeout and the 5 s the node
// lets requests in flight finish, with a margin.
func TestKubernetesKvnodeDrainsWithinItsGracePeriod(t *testing.T) {
	objects, _ := loadKubernetes(t)
	found := false
	for _, w := range ofKind(objects, "StatefulSet", "Deployment") {
		pod := m(w.doc, "spec", "template")
		for _, c := range l(pod, "spec", "containers") {
			if imageBinary(s(c, "image")) != "kvnode" {
				continue
			}
			found = true
			v, ok := flagValue(strs(l(c, "args")), "drain-timeout")
			require.True(t, ok, "%s: no --drain-timeout: the default (60s) should be said where the grace period is", w)
			drain, err := time.ParseDuration(v)
			require.NoError(t, err, "%s: --drain-timeout", w)
			grace, err := strconv.Atoi(s(pod, "spec", "terminationGracePeriodSeconds"))
			require.NoError(t, err, "%s: terminationGracePeriodSeconds", w)
			assert.GreaterOrEqual(t, time.Duration(grace)*time.Second, drain+10*time.Second,
				"%s: a grace period of %ds leaves no time to drain for %s and stop", w, grace, drain)
		}
	}
	assert.True(t, found, "a kvnode workload exists")
}
