package gateway

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockdev/airlock/gateway/route"
)

// metrics are the gateway's Prometheus metrics (namespace airlock, subsystem gateway):
//
//	airlock_gateway_requests_total{form,result}         counter
//	airlock_gateway_request_duration_seconds{result}    histogram, whole request incl. streaming
//	airlock_gateway_active_connections                  gauge, requests and streams in flight to sandboxes
//	airlock_gateway_routes                              gauge, sandboxes in the route table
//	airlock_gateway_watch_connected                     gauge, 1 while the watch stream is up
//	airlock_gateway_watch_lag_seconds                   gauge, age of the last change when applied
//	airlock_gateway_watch_reconnects_total              counter
//	airlock_gateway_renew_intents_total{result}         counter: sent, failed, dropped
//	airlock_gateway_certificate_permissions_total{result} counter: on-demand TLS answers (certResults)
//
// Label values are bounded: form is one of route.Form's names, result one of resultNames.
type metrics struct {
	requests   [numForms][numResults]prometheus.Counter
	duration   [numResults]prometheus.Observer
	active     prometheus.Gauge
	routes     prometheus.Gauge
	renew      *prometheus.CounterVec
	certs      *prometheus.CounterVec
	collectors []prometheus.Collector
	reg        prometheus.Registerer
}

const numForms = int(route.FormPath) + 1

// watchStatus is what the metrics read from the watch client.
type watchStatus func() (connected bool, lagSeconds float64, reconnects int)

func newMetrics(reg prometheus.Registerer, ws watchStatus) (*metrics, error) {
	const ns, sub = "airlock", "gateway"
	m := &metrics{reg: reg}
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
		Name: "requests_total", Help: "Requests by routing form and result."}, []string{"form", "result"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
		Name: "request_duration_seconds", Help: "Request duration by result, including streamed bodies.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 14)}, []string{"result"})
	m.active = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
		Name: "active_connections", Help: "Requests and streams in flight to sandboxes."})
	m.routes = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
		Name: "routes", Help: "Sandboxes in the route table."})
	m.renew = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
		Name: "renew_intents_total", Help: "Renew-on-access intents by result (sent, failed, dropped)."}, []string{"result"})
	m.certs = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
		Name: "certificate_permissions_total", Help: "On-demand TLS certificate permission answers by result."}, []string{"result"})
	for _, res := range certResults {
		m.certs.WithLabelValues(res)
	}
	connected := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
		Name: "watch_connected", Help: "1 while the lifecycle watch stream is connected."}, func() float64 {
		if c, _, _ := ws(); c {
			return 1
		}
		return 0
	})
	lag := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
		Name: "watch_lag_seconds", Help: "Age of the last watch change when it was applied."}, func() float64 {
		_, l, _ := ws()
		return l
	})
	reconnects := prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
		Name: "watch_reconnects_total", Help: "Reconnections of the lifecycle watch stream."}, func() float64 {
		_, _, n := ws()
		return float64(n)
	})
	for f := range numForms {
		for r := range numResults {
			m.requests[f][r] = requests.WithLabelValues(route.Form(f).String(), result(r).String())
		}
	}
	for r := range numResults {
		m.duration[r] = duration.WithLabelValues(result(r).String())
	}
	for _, res := range []string{"sent", "failed", "dropped"} {
		m.renew.WithLabelValues(res)
	}
	m.collectors = []prometheus.Collector{requests, duration, m.active, m.routes, m.renew, m.certs, connected, lag, reconnects}
	if reg == nil {
		return m, nil
	}
	for i, c := range m.collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range m.collectors[:i] {
				reg.Unregister(done)
			}
			if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
				return nil, errors.New("gateway: metrics already registered on this registry (one airlock app per registry)")
			}
			return nil, err
		}
	}
	return m, nil
}

// unregister removes the metrics from the registry they were registered on.
func (m *metrics) unregister() {
	if m == nil || m.reg == nil {
		return
	}
	for _, c := range m.collectors {
		m.reg.Unregister(c)
	}
}
