package source

import "github.com/prometheus/client_golang/prometheus"

// Metrics are what a process that follows the source says of it: whether the source answers,
// and its failures by class. The assigner (its clock) and the distributors (their watches)
// both export them, under their own namespace and subsystem.
type Metrics struct {
	// Available is 0 while the source does not answer, else 1.
	Available prometheus.Gauge
	// Errors counts the failures, by Class.
	Errors *prometheus.CounterVec
}

// NewMetrics returns the metrics, available and with every class exported at 0 (so that
// rate() and alerts see them), for reg to register; the helps say what fails in this process.
func NewMetrics(ns, sub, availableHelp, errorsHelp string) Metrics {
	m := Metrics{
		Available: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "source_available",
			Help: availableHelp}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "source_errors_total",
			Help: errorsHelp + " by class (unavailable, misconfigured, compacted)."}, []string{"class"}),
	}
	m.Available.Set(1)
	for _, c := range Classes {
		m.Errors.WithLabelValues(c.String())
	}
	return m
}

// Failed counts err under its class and returns the class.
func (m Metrics) Failed(err error) Class {
	c := ClassOf(err)
	m.Errors.WithLabelValues(c.String()).Inc()
	return c
}

// Collectors returns the metrics, to register.
func (m Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Available, m.Errors}
}
