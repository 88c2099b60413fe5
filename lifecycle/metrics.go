package lifecycle

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockdev/airlock/opensandbox"
)

// metrics are the lifecycle server's Prometheus metrics (namespace airlock, subsystem
// lifecycle).
type metrics struct {
	creates       *prometheus.CounterVec
	createSeconds prometheus.Histogram
	transitions   *prometheus.CounterVec
	reaped        prometheus.Counter
	orphans       prometheus.Counter
	poolClaims    *prometheus.CounterVec
	poolMisses    *prometheus.CounterVec
	poolReplenish *prometheus.HistogramVec
	leader        prometheus.Gauge
}

// poolsCollector reports airlock_lifecycle_pool_members{pool,state} at scrape time.
type poolsCollector struct {
	s    *Server
	desc *prometheus.Desc
}

func (c poolsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c poolsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.s.Pools() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(p.Ready), p.Name, "ready")
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(p.Warming), p.Name, "warming")
	}
}

// sandboxesCollector reports airlock_lifecycle_sandboxes{state} at scrape time.
type sandboxesCollector struct {
	s    *Server
	desc *prometheus.Desc
}

func (c sandboxesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c sandboxesCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[opensandbox.State]int{}
	c.s.mu.Lock()
	for _, e := range c.s.sbx {
		counts[e.rec.Status.State]++
	}
	c.s.mu.Unlock()
	for _, st := range opensandbox.States {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[st]), string(st))
	}
}

func newMetrics(reg prometheus.Registerer, s *Server) *metrics {
	const ns, sub = "airlock", "lifecycle"
	m := &metrics{
		creates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "creates_total",
			Help: "Sandbox create requests that reached the runtime, by result (ok, error).",
		}, []string{"result"}),
		createSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "create_duration_seconds",
			Help:    "Time from a create request to a started container.",
			Buckets: []float64{.1, .25, .5, 1, 2, 5, 10, 30, 120},
		}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "state_transitions_total",
			Help: "Sandbox state transitions, by the state entered.",
		}, []string{"state"}),
		reaped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "expired_total",
			Help: "Sandboxes removed by the reaper because they expired.",
		}),
		orphans: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "orphans_removed_total",
			Help: "Containers of this instance without a sandbox record, removed on start.",
		}),
		poolClaims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "pool_claims_total",
			Help: "Creates served by claiming a warm pool member, by pool.",
		}, []string{"pool"}),
		poolMisses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "pool_misses_total",
			Help: "Creates that matched a warm pool but found no ready member (served cold), by pool.",
		}, []string{"pool"}),
		poolReplenish: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "pool_replenish_duration_seconds",
			Help:    "Time to create one warm pool member until it is enforced and answers, by pool.",
			Buckets: []float64{.25, .5, 1, 2, 5, 10, 30, 120},
		}, []string{"pool"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "leader",
			Help: "1 while this replica leads (runs expiry, resync and reconcile); always 1 on a single host.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.poolClaims, m.poolMisses, m.poolReplenish,
			poolsCollector{s: s, desc: prometheus.NewDesc(ns+"_"+sub+"_pool_members",
				"Warm pool members, by pool and state (ready: claimable; warming: being created or checked).", []string{"pool", "state"}, nil)})
		reg.MustRegister(m.creates, m.createSeconds, m.transitions, m.reaped, m.orphans, m.leader,
			sandboxesCollector{s: s, desc: prometheus.NewDesc(ns+"_"+sub+"_sandboxes",
				"Sandboxes known to the lifecycle server, by state.", []string{"state"}, nil)})
	}
	return m
}

func (m *metrics) transition(st opensandbox.State) { m.transitions.WithLabelValues(string(st)).Inc() }
