// Package authztest reads what a server's Authorizer counted, for tests.
package authztest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Denied returns sliceplane_<server>_requests_denied_total{method} from g, by reason.
func Denied(t testing.TB, g prometheus.Gatherer, server, method string) map[string]float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatalf("authztest: gathering: %v", err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "sliceplane_"+server+"_requests_denied_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["method"] == method {
				out[labels["reason"]] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}
