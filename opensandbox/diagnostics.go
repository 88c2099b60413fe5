package opensandbox

import "time"

// Diagnostic payload kinds (docs/spec/diagnostic-api.yml, DiagnosticContentResponse.kind).
const (
	DiagnosticLogs   = "logs"
	DiagnosticEvents = "events"
)

// Diagnostic deliveries (DiagnosticContentResponse.delivery).
const (
	// DeliveryInline: the text is in Content.
	DeliveryInline = "inline"
	// DeliveryURL: the text is downloaded from ContentURL until ExpiresAt.
	DeliveryURL = "url"
)

// DiagnosticContentType is the media type of every diagnostic payload: display text,
// not a stable line schema.
const DiagnosticContentType = "text/plain; charset=utf-8"

// DiagnosticContent is the descriptor of GET /sandboxes/{id}/diagnostics/logs and
// /diagnostics/events (docs/spec/diagnostic-api.yml, DiagnosticContentResponse). With
// Delivery inline, Content holds the text and ContentURL and ExpiresAt are absent;
// with Delivery url, ContentURL and ExpiresAt are set and Content is absent.
type DiagnosticContent struct {
	SandboxID string `json:"sandboxId"`
	// Kind is DiagnosticLogs or DiagnosticEvents.
	Kind string `json:"kind"`
	// Scope is the scope the request asked for (container, runtime, …).
	Scope string `json:"scope"`
	// Delivery is DeliveryInline or DeliveryURL.
	Delivery    string `json:"delivery"`
	ContentType string `json:"contentType"`
	// Content is the text itself with Delivery inline (present even when empty), nil
	// otherwise.
	Content *string `json:"content,omitempty"`
	// ContentURL is an absolute URL (a URI per the spec).
	ContentURL string `json:"contentUrl,omitempty"`
	// ContentLength is the payload's size in bytes, when known.
	ContentLength *int64     `json:"contentLength,omitempty"`
	ExpiresAt     *time.Time `json:"expiresAt,omitempty"`
	// Truncated reports that the server left part of the text out on purpose (a size
	// limit), not retention gaps: those are Warnings.
	Truncated bool     `json:"truncated"`
	Warnings  []string `json:"warnings,omitempty"`
}
