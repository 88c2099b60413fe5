package dnsfilter

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the filter's Prometheus series (namespace airlock, subsystem dnsfilter).
type metrics struct {
	queries        *prometheus.CounterVec
	duration       *prometheus.HistogramVec
	cache          *prometheus.CounterVec
	shared         prometheus.Counter
	upstream       *prometheus.HistogramVec
	upstreamErrors *prometheus.CounterVec
	tcpRetries     prometheus.Counter
	rebinding      prometheus.Counter
	learn          prometheus.Histogram
	learnErrors    prometheus.Counter

	// resolved children of the vectors above, for the hot path
	cacheHit, cacheMiss, cachePrepared prometheus.Counter
	results                            map[string]resultMetrics
}

type resultMetrics struct {
	queries  prometheus.Counter
	duration prometheus.Observer
}

// results are the values of the result label.
var results = []string{"allow", "would_deny", "deny", "qtype", "guard", "unknown", "malformed", "servfail"}

// count counts one answered query by result, and its time since start.
func (m *metrics) count(result string, start time.Time) {
	r, ok := m.results[result]
	if !ok {
		r = resultMetrics{m.queries.WithLabelValues(result), m.duration.WithLabelValues(result)}
	}
	r.queries.Inc()
	r.duration.Observe(time.Since(start).Seconds())
}

func newMetrics(reg prometheus.Registerer, cacheLen func() float64) (*metrics, error) {
	const ns, sub = "airlock", "dnsfilter"
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	buckets := prometheus.ExponentialBuckets(0.00005, 4, 10)
	m := &metrics{
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "queries_total",
			Help: "Queries answered, by result: " + strings.Join(results, ", ") + "."}, []string{"result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "query_duration_seconds",
			Help: "Time from receiving a query to writing its answer, by result.", Buckets: buckets}, []string{"result"}),
		cache: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "cache_lookups_total",
			Help: "Answer cache lookups for allowed names, by result: prepared (answered from the answer prepared for the policy), hit or miss."}, []string{"result"}),
		shared: counter("singleflight_shared_total", "Upstream exchanges shared by concurrent identical queries."),
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "upstream_duration_seconds",
			Help: "Time per upstream exchange, by upstream.", Buckets: buckets}, []string{"upstream"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "upstream_errors_total",
			Help: "Failed upstream exchanges (timeouts, SERVFAIL, REFUSED), by upstream."}, []string{"upstream"}),
		tcpRetries:  counter("upstream_tcp_retries_total", "Upstream answers truncated over UDP and asked again over TCP."),
		rebinding:   counter("rebinding_dropped_total", "Answer addresses dropped by the policy (special ranges, overlay, IP rules)."),
		learnErrors: counter("learn_errors_total", "Learning hook failures (answered SERVFAIL)."),
		learn: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "learn_duration_seconds",
			Help: "Time the learning hook took (the answer waits for it).", Buckets: buckets}),
	}
	m.cacheHit, m.cacheMiss = m.cache.WithLabelValues("hit"), m.cache.WithLabelValues("miss")
	m.cachePrepared = m.cache.WithLabelValues("prepared")
	m.results = make(map[string]resultMetrics, len(results))
	for _, r := range results {
		m.results[r] = resultMetrics{m.queries.WithLabelValues(r), m.duration.WithLabelValues(r)}
	}
	if reg == nil {
		return m, nil
	}
	entries := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "cache_entries",
		Help: "Answers in the cache."}, cacheLen)
	for _, c := range []prometheus.Collector{m.queries, m.duration, m.cache, m.shared, m.upstream, m.upstreamErrors,
		m.tcpRetries, m.rebinding, m.learn, m.learnErrors, entries} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
