package assigner

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sliceplane/sliceplane/internal/assigner/core"

	"github.com/sliceplane/sliceplane/internal/source"
)

// metrics are the assigner's Prometheus metrics, in their own registry: the embedded etcd
// fills the default one with its own.
type metrics struct {
	leader       prometheus.Gauge
	term         prometheus.Gauge
	clock        prometheus.Gauge
	nodes        prometheus.Gauge
	slices       prometheus.Gauge
	imbalance    prometheus.Gauge
	nodeLoad     *prometheus.GaugeVec
	passDuration prometheus.Histogram
	passChurn    prometheus.Histogram
	quanta       *prometheus.CounterVec
	reports      *prometheus.CounterVec
	// reportsRejected counts refused load reports by reason: malformed, unknown_node,
	// not_finite, negative, over_cap, rate (over the member's reports a second).
	reportsRejected *prometheus.CounterVec
	passFailures    prometheus.Counter
	watchers        prometheus.Gauge
	etcdWrite       *prometheus.HistogramVec
	etcdRetries     *prometheus.CounterVec
	adminChanges    *prometheus.CounterVec
	// Make-before-break handoffs: begun, completed (every new node loaded the slice), rolled
	// back (timed out), under way, and how long the completed ones took.
	handoffsStarted, handoffsCompleted, handoffsRolledBack prometheus.Counter
	handoffsInProgress                                     prometheus.Gauge
	handoffDuration                                        prometheus.Histogram
	// primaryHandovers counts the primaries handed over in planned moves, by how the old
	// one ended: demoted, or forced (it did not within --handoff-timeout).
	primaryHandovers *prometheus.CounterVec
	// source says whether the leader follows its source's clock, and counts the failed
	// watches and clock reads.
	source source.Metrics
	// quarantined is how many ranges no node holds now, their holders having crashed on
	// them (a key of death), and quarantinedShare their share of the key space; quarantines
	// counts the ranges put in quarantine, and probes the probes that narrow them, by how
	// they ended.
	quarantined      prometheus.Gauge
	quarantinedShare prometheus.Gauge
	quarantines      prometheus.Counter
	probes           *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns, sub = "sliceplane", "assigner"
	m := &metrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "leader",
			Help: "1 if this assigner is the leader, else 0."}),
		term: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "term",
			Help: "The term of the current leadership, if this assigner leads."}),
		clock: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "clock",
			Help: "The Lamport clock of the last quantum."}),
		nodes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "nodes",
			Help: "Registered nodes."}),
		slices: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "slices",
			Help: "Slices in the assignment."}),
		imbalance: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "imbalance_ratio",
			Help: "Max over mean node load (over capacity) as the last pass saw it; 1 is perfect."}),
		nodeLoad: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "node_load",
			Help: "Estimated load of each node over its capacity, in the application's load unit."}, []string{"node"}),
		passDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "pass_duration_seconds",
			Help: "Time of a balancing pass, persistence included.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		passChurn: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "pass_churn_ratio",
			Help: "Share of keys a pass copied to new nodes.", Buckets: []float64{0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.09, 0.2, 0.5, 1}}),
		quanta: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "quanta_total",
			Help: "Quanta emitted, by cause (initial, pass, cleanup, clock, distributors, admin, node, quarantine, quarantine probe)."}, []string{"cause"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "load_reports_total",
			Help: "Load reports received, by result (accepted, rejected)."}, []string{"result"}),
		reportsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "reports_rejected_total",
			Help: "Load reports refused whole, by reason (malformed, unknown_node, not_finite, negative, over_cap, rate)."}, []string{"reason"}),
		passFailures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "pass_failures_total",
			Help: "Balancing passes that failed; the clean-up of departed nodes ran without the algorithm instead."}),
		watchers: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "watchers",
			Help: "Open assignment and quanta streams."}),
		etcdRetries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "etcd_retries_total",
			Help: "etcd requests of the leader retried after a passing failure (an etcd election), by operation."}, []string{"op"}),
		etcdWrite: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "etcd_write_duration_seconds",
			Help: "Latency of the assigner's fenced etcd transactions, by operation.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"op"}),
		adminChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "admin_requests_total",
			Help: "Admin requests, by call and result (ok, refused)."}, []string{"call", "result"}),
		handoffsStarted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "handoffs_started_total",
			Help: "Slices that began a make-before-break handoff."}),
		handoffsCompleted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "handoffs_completed_total",
			Help: "Handoffs that ended with every new node serving the slice."}),
		primaryHandovers: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "primary_handovers_total",
			Help: "Primary roles handed over in planned moves (--roles primary-secondary), by how the old primary ended: demoted, or forced after --handoff-timeout."},
			[]string{"end"}),
		handoffsRolledBack: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "handoffs_rolled_back_total",
			Help: "Handoffs rolled back after --handoff-timeout: the new nodes dropped the slice, the old ones kept it."}),
		handoffsInProgress: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "handoffs_in_progress",
			Help: "Slices in handoff."}),
		handoffDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "handoff_duration_seconds",
			Help:    "Time from the start of a handoff to its completion, as the leader that completed it saw it.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 12)}),
		source: source.NewMetrics(ns, sub, "0 while this assigner leads and cannot follow its source's clock (balancing passes are held), else 1.",
			"Failed watches and clock reads of the source,"),
	}
	m.quarantined = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "quarantined_ranges",
		Help: "Ranges in quarantine: held by no node, as their holders crashed shortly after acquiring them (lift with slicectl unquarantine)."})
	m.quarantines = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "quarantines_total",
		Help: "Ranges put in quarantine because two nodes crashed shortly after acquiring them."})
	m.quarantinedShare = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "quarantined_ratio",
		Help: "Share of the key space in quarantine, held by no node; narrowing takes a quarantine down to 1/1024 of the space."})
	m.probes = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "quarantine_probes_total",
		Help: "Probes that narrow quarantines, ended, by how: crashed (the canary crashed; the quarantine narrowed to its part), " +
			"served (the canary served its part; the quarantine narrowed to the rest, or was lifted), abandoned (no verdict)."}, []string{"end"})
	for _, end := range []string{"crashed", "served", "abandoned"} {
		m.probes.WithLabelValues(end)
	}
	for _, r := range []string{"malformed", "unknown_node", "not_finite", "negative", "over_cap", "rate"} {
		m.reportsRejected.WithLabelValues(r) // exported at 0, so that rates and alerts see them
	}
	reg.MustRegister(m.leader, m.term, m.clock, m.nodes, m.slices, m.imbalance, m.nodeLoad, m.passDuration,
		m.passChurn, m.quanta, m.reports, m.reportsRejected, m.passFailures, m.watchers, m.etcdWrite, m.etcdRetries, m.adminChanges,
		m.handoffsStarted, m.handoffsCompleted, m.handoffsRolledBack, m.primaryHandovers, m.handoffsInProgress, m.handoffDuration,
		m.quarantined, m.quarantinedShare, m.quarantines, m.probes)
	reg.MustRegister(m.source.Collectors()...)
	return m
}

// observeQuarantine counts the quarantines and probes that one step's output ended or began;
// it reports whether there were any.
func (m *metrics) observeQuarantine(out core.Output) bool {
	m.quarantines.Add(float64(out.Quarantined))
	m.probes.WithLabelValues("crashed").Add(float64(out.Probes.Crashed))
	m.probes.WithLabelValues("served").Add(float64(out.Probes.Served))
	m.probes.WithLabelValues("abandoned").Add(float64(out.Probes.Abandoned))
	return out.Quarantined > 0 || out.Probes != core.ProbeStats{}
}
