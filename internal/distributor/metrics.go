package distributor

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/source"
)

// metrics are the distributor's Prometheus metrics.
type metrics struct {
	clock       prometheus.Gauge
	lag         prometheus.Gauge
	quanta      prometheus.Counter
	changes     prometheus.Counter
	served      prometheus.Gauge
	streams     prometheus.Gauge
	queueOps    *prometheus.GaugeVec
	queueBytes  *prometheus.GaugeVec
	deltas      prometheus.Counter
	opsSent     prometheus.Counter
	snapshots   prometheus.Counter
	overflows   prometheus.Counter
	scans       *prometheus.CounterVec
	scanLatency prometheus.Histogram
	applyLag    prometheus.Histogram
	// quantaSilent counts quanta streams dropped because they went silent (a hung leader).
	quantaSilent  prometheus.Counter
	quantaRefused *prometheus.CounterVec
	rejected      *prometheus.CounterVec
	scanPauses    prometheus.Counter
	// source says whether the source watch is up, and counts the watches that failed.
	source source.Metrics
	// relayWatchers counts the routers and members watching this distributor's copy of the
	// map; relayRefused the quanta the relay did not take.
	relayWatchers prometheus.Gauge
	relayRefused  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns, sub = "sliceplane", "distributor"
	m := &metrics{
		clock: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "clock",
			Help: "The router's clock: every source change up to it has been routed."}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "source_lag_clock",
			Help: "How far, in source clock units, the router is behind the latest clock it knows of."}),
		quanta: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "quanta_applied_total",
			Help: "Quanta applied by the router."}),
		changes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "changes_routed_total",
			Help: "Source changes routed."}),
		served: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "nodes",
			Help: "Nodes this distributor serves."}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "pull_streams",
			Help: "Open Pull streams."}),
		queueOps: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "queue_ops",
			Help: "Operations queued for each node and not yet acknowledged."}, []string{"node"}),
		queueBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "queue_bytes",
			Help: "Bytes queued for each node and not yet acknowledged."}, []string{"node"}),
		deltas: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "deltas_sent_total",
			Help: "Deltas sent to nodes."}),
		opsSent: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "ops_sent_total",
			Help: "Operations (items, fragments, slice changes) sent to nodes."}),
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "snapshots_total",
			Help: "Snapshots started: new nodes, restarts, overflows and failed scans."}),
		overflows: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "queue_overflows_total",
			Help: "Node queues dropped for holding more than their bound; the node catches up by snapshot."}),
		scans: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "scans_total",
			Help: "Source scans, by result (ok, compacted, error)."}, []string{"result"}),
		scanLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "scan_duration_seconds",
			Help: "Time from asking for a scan of a range of the source to its last item, waits for the node to take what it read included.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		applyLag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "apply_latency_seconds",
			Help: "From routing a change to the node's acknowledgement of it.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		quantaSilent: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "quanta_stream_silences_total",
			Help: "Quanta streams dropped because the assigner sent nothing, not even a heartbeat, for too long."}),
		quantaRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "quanta_refused_total",
			Help: "Quanta refused and not applied, by reason: stale_term (from a deposed leader), stale, out_of_sequence, does_not_apply."}, []string{"reason"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "source_rejected_total",
			Help: "Keys under the source's prefix skipped because they name no item or fragment, by reason."}, []string{"reason"}),
		scanPauses: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "scan_pauses_total",
			Help: "Times a scan stopped to wait for its node to take what it read (--max-scan-ahead-bytes)."}),
		source: source.NewMetrics(ns, sub, "0 from a failed watch of the source until the source answers again, else 1.",
			"Watches of the source that failed,"),
		relayWatchers: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "relay_watchers",
			Help: "Open watches of the assignment relayed by this distributor (routers and members)."}),
		relayRefused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "relay_quanta_refused_total",
			Help: "Quanta the relay did not take (an older term, or not following its map); the quanta stream starts over."}),
	}
	// Every label value exported at 0, so that rate() and alerts see it.
	for _, reason := range []string{quantum.StaleTerm, quantum.Stale, quantum.OutOfSequence, "does_not_apply"} {
		m.quantaRefused.WithLabelValues(reason)
	}
	for _, r := range source.RejectReasons {
		m.rejected.WithLabelValues(string(r))
	}
	reg.MustRegister(m.clock, m.lag, m.quanta, m.changes, m.served, m.streams, m.queueOps, m.queueBytes,
		m.deltas, m.opsSent, m.snapshots, m.overflows, m.scans, m.scanLatency, m.applyLag, m.quantaSilent,
		m.quantaRefused, m.rejected, m.scanPauses, m.relayWatchers, m.relayRefused)
	reg.MustRegister(m.source.Collectors()...)
	return m
}
