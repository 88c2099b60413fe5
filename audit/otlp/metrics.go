package otlp

import (
	"context"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/airlockdev/airlock/audit"
)

// The metrics derived from the audit records, named as OpenSandbox's OSEP-0010
// (OpenSandbox repository, oseps, OSEP-0010 "OpenTelemetry Metrics and Logs", §1)
// where it names them. Their
// attributes are bounded enums (source, action, method, status code, operation):
// never a host name, address, path or sandbox id.
const (
	// MetricIngressRequests counts requests through the gateway by
	// http.request.method, http.response.status_code and proxy_type (http or
	// websocket) (OSEP-0010 §1.3 ingress.http.request.count).
	MetricIngressRequests = "ingress.http.request.count"
	// MetricIngressDuration is the gateway's request duration in ms, including
	// streaming (§1.3 ingress.http.request.duration).
	MetricIngressDuration = "ingress.http.request.duration"
	// MetricPolicyEvaluations counts egress decisions by action and source (dns, bpf,
	// l7, credential) (§1.2 egress.policy.evaluations.count).
	MetricPolicyEvaluations = "egress.policy.evaluations.count"
	// MetricPolicyDenied counts egress denials by source (§1.2 egress.policy.denied_total).
	MetricPolicyDenied = "egress.policy.denied_total"
	// MetricDNSQueries counts the DNS filter's answered queries by action (Airlock's;
	// OSEP-0010 has only the duration, which the records do not carry).
	MetricDNSQueries = "egress.dns.query.count"
	// MetricExecdRequests counts execd calls seen on the host by operation (the
	// record's extra.op: command, code, file.upload, ...) and status code (§1.1
	// execd.http.request.count, with the operation standing for the route template).
	MetricExecdRequests = "execd.http.request.count"
	// MetricExecdRequestDuration is their duration in ms (§1.1 execd.http.request.duration).
	MetricExecdRequestDuration = "execd.http.request.duration"
	// MetricExecutions counts command and code executions by result (success,
	// failure, incomplete: the record's extra.outcome) (§1.1 execd.execution.count).
	MetricExecutions = "execd.execution.count"
	// MetricExecutionDuration is execd's execution time in ms (§1.1 execd.execution.duration).
	MetricExecutionDuration = "execd.execution.duration"
)

type derived struct {
	ingress, evals, denied, dns, execdReqs, execs metric.Int64Counter
	ingressDur, execdDur, execDur                 metric.Float64Histogram
}

func newDerived(m metric.Meter) (*derived, error) {
	d := &derived{}
	var err error
	counter := func(name, unit, desc string) metric.Int64Counter {
		var c metric.Int64Counter
		if err == nil {
			c, err = m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		}
		return c
	}
	hist := func(name, desc string) metric.Float64Histogram {
		var h metric.Float64Histogram
		if err == nil {
			h, err = m.Float64Histogram(name, metric.WithUnit("ms"), metric.WithDescription(desc))
		}
		return h
	}
	d.ingress = counter(MetricIngressRequests, "{request}", "Requests through the gateway")
	d.ingressDur = hist(MetricIngressDuration, "Gateway request duration, including streaming")
	d.evals = counter(MetricPolicyEvaluations, "{decision}", "Egress policy decisions")
	d.denied = counter(MetricPolicyDenied, "{decision}", "Egress policy denials")
	d.dns = counter(MetricDNSQueries, "{query}", "DNS queries answered by the egress DNS filter")
	d.execdReqs = counter(MetricExecdRequests, "{request}", "execd calls seen on the host")
	d.execdDur = hist(MetricExecdRequestDuration, "execd call duration seen on the host")
	d.execs = counter(MetricExecutions, "{execution}", "Command and code executions")
	d.execDur = hist(MetricExecutionDuration, "execd's execution time")
	return d, err
}

// observe counts r. Only the record's own bounded fields become attributes.
func (d *derived) observe(ctx context.Context, r *audit.Record) {
	switch r.Source {
	case audit.SourceGateway:
		status := intExtra(r.Extra, "status")
		proxy := "http"
		if status == 101 {
			proxy = "websocket"
		}
		attrs := metric.WithAttributes(attribute.String("http.request.method", method(r.Extra)),
			attribute.Int("http.response.status_code", status), attribute.String("proxy_type", proxy))
		d.ingress.Add(ctx, 1, attrs)
		if ms, ok := r.Extra["duration_ms"].(float64); ok {
			d.ingressDur.Record(ctx, ms, attrs)
		}
	case audit.SourceDNS, audit.SourceBPF, audit.SourceL7, audit.SourceCredential:
		if r.Action != "allow" && r.Action != "deny" {
			return
		}
		attrs := metric.WithAttributes(attribute.String("action", r.Action), attribute.String("source", string(r.Source)))
		d.evals.Add(ctx, 1, attrs)
		if r.Action == "deny" {
			d.denied.Add(ctx, 1, metric.WithAttributes(attribute.String("source", string(r.Source))))
		}
		if r.Source == audit.SourceDNS {
			d.dns.Add(ctx, 1, metric.WithAttributes(attribute.String("action", r.Action)))
		}
	case audit.SourceExecd:
		op, _ := r.Extra["op"].(string)
		attrs := metric.WithAttributes(attribute.String("operation", op),
			attribute.Int("http.response.status_code", intExtra(r.Extra, "status")))
		d.execdReqs.Add(ctx, 1, attrs)
		if ms, ok := r.Extra["duration_ms"].(float64); ok {
			d.execdDur.Record(ctx, ms, attrs)
		}
		if op == "command" || op == "code" || op == "session.run" {
			result, _ := r.Extra["outcome"].(string) // success, failure, incomplete
			d.execs.Add(ctx, 1, metric.WithAttributes(attribute.String("result", result)))
			if ms, ok := r.Extra["execution_ms"].(float64); ok {
				d.execDur.Record(ctx, ms, metric.WithAttributes(attribute.String("result", result)))
			}
		}
	}
}

// method is the request method of a gateway record (bounded to the standard ones).
func method(extra map[string]any) string {
	m, _ := extra["method"].(string)
	switch m {
	case "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE":
		return m
	}
	return "_OTHER"
}

func intExtra(extra map[string]any, k string) int {
	switch v := extra[k].(type) {
	case float64:
		return int(v)
	case int:
		return v
	case int64:
		return int(v)
	case string:
		n, _ := strconv.Atoi(v)
		return n
	}
	return 0
}
