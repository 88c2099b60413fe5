package stack

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"

	promBridge "go.opentelemetry.io/contrib/bridges/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/airlockdev/airlock/audit/otlp"
	"github.com/airlockdev/airlock/internal/buildinfo"
)

// TelemetryConfig is OpenTelemetry export (airlock.yaml telemetry:). Off unless an
// endpoint is set, here or by the standard OTEL_EXPORTER_OTLP_ENDPOINT (or its
// per-signal OTEL_EXPORTER_OTLP_{LOGS,METRICS,TRACES}_ENDPOINT) variables; the other
// OTEL_EXPORTER_OTLP_* variables (headers, timeout, compression, certificate) and
// OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES apply as the OpenTelemetry
// specification says. OTLP over HTTP (http/protobuf) only.
//
//	telemetry:
//	  otlp:
//	    endpoint: http://collector.example:4318   # base URL; /v1/logs etc. are appended
//	    logs: true      # the audit records (their OCSF events) as OTLP logs
//	    metrics: true   # OSEP-0010 metrics derived from the records + every airlock_* metric
//	    traces: true    # spans of the lifecycle API, the gateway and a create's steps
type TelemetryConfig struct {
	OTLP OTLPConfig `yaml:"otlp"`
}

// OTLPConfig is the OTLP exporter's settings; each signal defaults to on when an
// endpoint is known.
type OTLPConfig struct {
	Endpoint string `yaml:"endpoint"`
	Logs     *bool  `yaml:"logs"`
	Metrics  *bool  `yaml:"metrics"`
	Traces   *bool  `yaml:"traces"`
}

// signal reports whether the signal (logs, metrics, traces) is exported: its switch
// (default on) and an endpoint from the configuration or the environment.
func (c OTLPConfig) signal(name string, on *bool) bool {
	if on != nil && !*on || strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	return c.Endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" ||
		os.Getenv("OTEL_EXPORTER_OTLP_"+strings.ToUpper(name)+"_ENDPOINT") != ""
}

// check rejects what the exporters cannot do: a malformed endpoint or a protocol other
// than http/protobuf.
func (c OTLPConfig) check() error {
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("telemetry.otlp.endpoint %q: want an http(s) base URL such as http://collector:4318", c.Endpoint)
		}
	}
	for _, v := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL",
		"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		if p := os.Getenv(v); p != "" && p != "http/protobuf" {
			return fmt.Errorf("%s=%s: Airlock exports OTLP over HTTP only (http/protobuf)", v, p)
		}
	}
	return nil
}

// telemetry is what startTelemetry started, stopped in reverse by stopTelemetry.
type telemetry struct {
	exporter *otlp.Exporter
	meter    *sdkmetric.MeterProvider
	tracer   *sdktrace.TracerProvider
}

// startTelemetry starts the OTLP exports the configuration asks for (none: nothing).
func (s *Stack) startTelemetry(ctx context.Context) error {
	c := s.cfg.Telemetry.OTLP
	logs, metrics, traces := c.signal("logs", c.Logs), c.signal("metrics", c.Metrics), c.signal("traces", c.Traces)
	if !logs && !metrics && !traces {
		return nil
	}
	if err := c.check(); err != nil {
		return err
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithHost(),
		resource.WithAttributes(semconv.ServiceName("airlock"), semconv.ServiceVersion(buildinfo.Version)))
	if err != nil {
		return fmt.Errorf("telemetry resource: %w", err)
	}
	t := &telemetry{}
	s.telemetry = t
	if metrics {
		var opts []otlpmetrichttp.Option
		if c.Endpoint != "" {
			opts = append(opts, otlpmetrichttp.WithEndpointURL(strings.TrimSuffix(c.Endpoint, "/")+"/v1/metrics"))
		}
		ex, err := otlpmetrichttp.New(ctx, opts...)
		if err != nil {
			return fmt.Errorf("telemetry metrics: %w", err)
		}
		reader := sdkmetric.NewPeriodicReader(ex, sdkmetric.WithProducer(promBridge.NewMetricProducer(promBridge.WithGatherer(s.registry))))
		t.meter = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithResource(res))
	}
	if traces {
		var opts []otlptracehttp.Option
		if c.Endpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpointURL(strings.TrimSuffix(c.Endpoint, "/")+"/v1/traces"))
		}
		ex, err := otlptracehttp.New(ctx, opts...)
		if err != nil {
			return fmt.Errorf("telemetry traces: %w", err)
		}
		t.tracer = sdktrace.NewTracerProvider(sdktrace.WithBatcher(ex), sdktrace.WithResource(res))
		otel.SetTracerProvider(t.tracer)
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	}
	cfg := otlp.Config{ChainDir: s.cfg.Audit.Dir, Resource: res, Progress: s.Audit.Written, Logger: s.log.With("component", "otlp")}
	if t.meter != nil {
		cfg.Meter = t.meter
	}
	if logs {
		var opts []otlploghttp.Option
		if c.Endpoint != "" {
			opts = append(opts, otlploghttp.WithEndpointURL(strings.TrimSuffix(c.Endpoint, "/")+"/v1/logs"))
		}
		// The exporter retries on its own (audit/otlp), so the client does not.
		opts = append(opts, otlploghttp.WithRetry(otlploghttp.RetryConfig{Enabled: false}))
		if cfg.Logs, err = otlploghttp.New(ctx, opts...); err != nil {
			return fmt.Errorf("telemetry logs: %w", err)
		}
	}
	if cfg.Logs != nil || cfg.Meter != nil {
		if t.exporter, err = otlp.New(cfg); err != nil {
			return err
		}
	}
	s.log.Info("OpenTelemetry export on", "logs", logs, "metrics", metrics, "traces", traces)
	return nil
}

// stopTelemetry flushes and stops the exports.
func (s *Stack) stopTelemetry(ctx context.Context) error {
	t := s.telemetry
	if t == nil {
		return nil
	}
	var errs []error
	if t.exporter != nil {
		errs = append(errs, t.exporter.Close())
	}
	if t.meter != nil {
		errs = append(errs, t.meter.Shutdown(ctx))
	}
	if t.tracer != nil {
		errs = append(errs, t.tracer.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// traceAPI wraps the API (lifecycle and console) in server spans when traces are
// exported: a client's W3C traceparent joins them, and a create's spans
// (lifecycle.create, runtime.create, lifecycle.ready) are their children. Span names
// carry the method only, never a path with ids.
func (s *Stack) traceAPI(h http.Handler) http.Handler {
	if s.telemetry == nil || s.telemetry.tracer == nil {
		return h
	}
	return otelhttp.NewHandler(h, "airlock.api", otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
		return "airlock.api " + r.Method
	}))
}
