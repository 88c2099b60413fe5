package egressd

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are egressd's own series (the DNS filter registers airlock_dnsfilter_*).
type metrics struct {
	sandboxes  prometheus.Gauge
	updates    prometheus.Counter
	learns     *prometheus.CounterVec
	events     *prometheus.CounterVec
	suppressed prometheus.Counter
	errors     *prometheus.CounterVec
	info       *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		sandboxes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "airlock", Subsystem: "egressd",
			Name: "sandboxes", Help: "Sandboxes egressd holds (attached or awaiting attach)."}),
		updates: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "airlock", Subsystem: "egressd",
			Name: "policy_updates_total", Help: "Policy changes applied to running sandboxes."}),
		learns: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "airlock", Subsystem: "egressd",
			Name: "learned_addresses_total", Help: "Addresses learned from DNS answers, by result (ok, error)."}, []string{"result"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "airlock", Subsystem: "egressd",
			Name: "datapath_events_total", Help: "Datapath events received, by kind (flow, drop, would_drop)."}, []string{"kind"}),
		suppressed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "airlock", Subsystem: "egressd",
			Name: "audit_flows_suppressed_total", Help: "Flow records held back by the per-sandbox audit rate limit (each counted in a suppressed record)."}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "airlock", Subsystem: "egressd",
			Name: "errors_total", Help: "Failures by operation (attach, update, detach, policy)."}, []string{"op"}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "airlock", Subsystem: "egressd",
			Name: "backend_info", Help: "The datapath backend in use (value 1)."}, []string{"backend"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.sandboxes, m.updates, m.learns, m.events, m.suppressed, m.errors, m.info} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("egressd metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *metrics) backend(name string) { m.info.WithLabelValues(name).Set(1) }
