package lifecycle

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// tracer makes the spans of a create (lifecycle.create, runtime.create and
// lifecycle.ready, with the events egress.enforced and execd.released). It is the
// global provider's: a no-op unless the server's process installs one (stack's
// telemetry: OTLP traces).
var tracer = otel.Tracer("github.com/airlockdev/airlock/lifecycle")

// attrSandbox is the sandbox id on spans (OSEP-0010's osbx.id).
const attrSandbox = "osbx.id"

// endSpan ends span, marking it failed when err is set.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// readySpan starts the span of the wait for a sandbox's readiness, a child of the
// create that started it (parent: that span's context; invalid: a root span).
func readySpan(parent trace.SpanContext, id string) trace.Span {
	ctx := context.Background()
	if parent.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, parent)
	}
	_, span := tracer.Start(ctx, "lifecycle.ready", trace.WithAttributes(attribute.String(attrSandbox, id)))
	return span
}

// traceParent is the W3C traceparent of ctx's span ("" when it is not sampled, as when
// traces are off).
func traceParent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsSampled() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c["traceparent"]
}
