package egressd

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/airlockdev/airlock/lifecycle/watch"
)

// tracer makes the egressd.attach span of a sandbox whose create was traced
// (watch.Sandbox.TraceParent): the global provider's, a no-op unless the process
// installs one (stack's telemetry).
var tracer = otel.Tracer("github.com/airlockdev/airlock/egressd")

// attachSpan starts the span of s's first attach in the trace of its create; nil when
// the create was not traced.
func attachSpan(s watch.Sandbox) trace.Span {
	if s.TraceParent == "" {
		return nil
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": s.TraceParent})
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	_, span := tracer.Start(ctx, "egressd.attach", trace.WithAttributes(attribute.String("osbx.id", s.ID)))
	return span
}

// endAttachSpan ends span (nil: nothing) with the attach's outcome.
func endAttachSpan(span trace.Span, err error, backend string) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.String("airlock.egress.backend", backend))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
