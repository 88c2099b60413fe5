package lifecycle

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
)

// Diagnoser is implemented by runtimes that report a sandbox's container output and
// runtime events (lifecycle/docker and lifecycle/kube both do); the diagnostics API
// (docs/spec/diagnostic-api.yml) reads them. Both methods perform I/O against the
// engine or the API server and may take seconds; callers pass a deadline.
type Diagnoser interface {
	// Logs returns the container's stdout and stderr as the runtime interleaved them,
	// every line prefixed with its RFC 3339 timestamp and a space, at most maxBytes:
	// the newest lines (truncated reports that older ones were left out). Output after
	// t.Until (when set) may be left out. An error wrapping ErrDiagnosticsUnavailable is
	// written for users (the container is gone, the pod has not started); any other
	// error is internal.
	Logs(ctx context.Context, t DiagnosticTarget, maxBytes int) (text []byte, truncated bool, err error)
	// Events returns what the runtime reports of the sandbox from t.Since to t.Until
	// (zero: now), in any order: the image pull, the container's create and start, OOM
	// kills, its exit and exit code (Docker: engine events and the container's state;
	// Kubernetes: the pod's Events and its containers' states), with Source
	// EventRuntime. warnings name what could not be read (written for users). Errors
	// are as for Logs.
	Events(ctx context.Context, t DiagnosticTarget) (events []Event, warnings []string, err error)
}

// ErrDiagnosticsUnavailable marks a Diagnoser error whose text is written for users:
// the diagnostics API shows it as a warning.
var ErrDiagnosticsUnavailable = errors.New("diagnostics unavailable")

// DiagnosticTarget names the sandbox a Diagnoser reports on.
type DiagnosticTarget struct {
	SandboxID   string
	ContainerID string
	// Image is the local image the sandbox runs (after Config.ImageAliases).
	Image string
	// Since is the sandbox's creation; Until bounds the report (zero: now).
	Since, Until time.Time
}

// Defaults of the diagnostics limits (Config.Diagnostics).
const (
	DefaultDiagnosticsMaxBytes    = 4 << 20
	DefaultDiagnosticsInlineBytes = 64 << 10
	DefaultDiagnosticsURLLifetime = 15 * time.Minute
)

// DiagnosticsConfig bounds the diagnostics API (GET /sandboxes/{id}/diagnostics/logs
// and /events). Zero values take the defaults.
type DiagnosticsConfig struct {
	// MaxBytes caps one payload (the newest text is kept, truncated is then true);
	// default DefaultDiagnosticsMaxBytes (4 MiB).
	MaxBytes int
	// InlineBytes is the largest payload answered inline; a larger one is delivered by
	// URL (a request may ask for either with ?delivery=); default 64 KiB.
	InlineBytes int
	// URLLifetime is how long a download URL works; default 15 min.
	URLLifetime time.Duration
}

func (c *DiagnosticsConfig) setDefaults() {
	if c.MaxBytes <= 0 {
		c.MaxBytes = DefaultDiagnosticsMaxBytes
	}
	if c.InlineBytes <= 0 {
		c.InlineBytes = DefaultDiagnosticsInlineBytes
	}
	if c.InlineBytes > c.MaxBytes {
		c.InlineBytes = c.MaxBytes
	}
	if c.URLLifetime <= 0 {
		c.URLLifetime = DefaultDiagnosticsURLLifetime
	}
}

// Scopes each kind serves (the spec leaves them to the implementation).
var (
	logScopes   = []string{"container", "all"}
	eventScopes = []string{EventLifecycle, EventNetwork, EventRuntime, "all"}
)

// diagRecords is what the diagnostics API needs of the registry (the Server); neither
// method performs I/O.
type diagRecords interface {
	// diagTarget returns sandbox id's target (ErrNotFound when unknown).
	diagTarget(id string) (DiagnosticTarget, error)
	// events returns a copy of the sandbox's recorded events.
	events(id string) ([]Event, error)
}

// diagnosticsAPI serves the diagnostics routes: descriptors behind the API key, and
// the download URLs they hand out, which carry their own signature (a presigned URL:
// HMAC-SHA256 under a key derived from Config.ExecdKey, so every replica verifies what
// another signed) and re-render the text up to the descriptor's time.
type diagnosticsAPI struct {
	reg        diagRecords
	rt         Diagnoser // nil: the runtime reports nothing
	kind       string
	cfg        DiagnosticsConfig
	key        []byte
	publicAddr string
	log        *slog.Logger
}

// downloadPattern is the download route (served without the API key: the signature
// admits it).
const downloadPattern = "GET /sandboxes/{id}/diagnostics/{kind}/download"

func (a *diagnosticsAPI) routes(m *http.ServeMux) {
	m.HandleFunc("GET /sandboxes/{id}/diagnostics/logs", func(w http.ResponseWriter, r *http.Request) {
		a.describe(w, r, opensandbox.DiagnosticLogs)
	})
	m.HandleFunc("GET /sandboxes/{id}/diagnostics/events", func(w http.ResponseWriter, r *http.Request) {
		a.describe(w, r, opensandbox.DiagnosticEvents)
	})
	m.HandleFunc(downloadPattern, a.download)
}

// isDiagnosticDownload reports whether r asks for a diagnostics download URL (path
// already without /v1).
func isDiagnosticDownload(r *http.Request) bool {
	if r.Method != http.MethodGet {
		return false
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/sandboxes/")
	if !ok {
		return false
	}
	parts := strings.Split(rest, "/")
	return len(parts) == 4 && parts[0] != "" && parts[1] == "diagnostics" &&
		(parts[2] == opensandbox.DiagnosticLogs || parts[2] == opensandbox.DiagnosticEvents) && parts[3] == "download"
}

// describe answers the DiagnosticContent of kind for the request's sandbox and scope.
func (a *diagnosticsAPI) describe(w http.ResponseWriter, r *http.Request, kind string) {
	id, q := r.PathValue("id"), r.URL.Query()
	scope := q.Get("scope")
	if err := checkScope(kind, scope); err != nil {
		fail(a.log, w, r, err)
		return
	}
	delivery := q.Get("delivery")
	if delivery != "" && delivery != opensandbox.DeliveryInline && delivery != opensandbox.DeliveryURL {
		fail(a.log, w, r, fmt.Errorf("%w: delivery must be inline or url", ErrInvalidRequest))
		return
	}
	until := time.Now().UTC()
	text, truncated, warnings, err := a.render(r, id, kind, scope, until)
	if err != nil {
		fail(a.log, w, r, err)
		return
	}
	out := opensandbox.DiagnosticContent{
		SandboxID: id, Kind: kind, Scope: scope, ContentType: opensandbox.DiagnosticContentType,
		Truncated: truncated, Warnings: warnings,
	}
	n := int64(len(text))
	out.ContentLength = &n
	if delivery == opensandbox.DeliveryURL || (delivery == "" && len(text) > a.cfg.InlineBytes) {
		exp := time.Now().Add(a.cfg.URLLifetime).UTC().Truncate(time.Second)
		out.Delivery, out.ContentURL, out.ExpiresAt = opensandbox.DeliveryURL, a.downloadURL(r, id, kind, scope, until, exp), &exp
	} else {
		s := string(text)
		out.Delivery, out.Content = opensandbox.DeliveryInline, &s
	}
	opensandbox.WriteJSON(w, http.StatusOK, out)
}

func checkScope(kind, scope string) error {
	scopes := logScopes
	if kind == opensandbox.DiagnosticEvents {
		scopes = eventScopes
	}
	if scope == "" {
		return fmt.Errorf("%w: scope is required: one of %s", ErrInvalidRequest, strings.Join(scopes, ", "))
	}
	if !slices.Contains(scopes, scope) {
		return fmt.Errorf("%w: %s scope %q is not supported: one of %s", ErrInvalidRequest, kind, scope, strings.Join(scopes, ", "))
	}
	return nil
}

// render produces the text of kind and scope for sandbox id, up to until.
func (a *diagnosticsAPI) render(r *http.Request, id, kind, scope string, until time.Time) ([]byte, bool, []string, error) {
	t, err := a.reg.diagTarget(id)
	if err != nil {
		return nil, false, nil, err
	}
	t.Until = until
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	if kind == opensandbox.DiagnosticLogs {
		return a.logs(ctx, r, t)
	}
	return a.events(ctx, r, t, scope)
}

func (a *diagnosticsAPI) logs(ctx context.Context, r *http.Request, t DiagnosticTarget) ([]byte, bool, []string, error) {
	if a.rt == nil {
		return nil, false, nil, fmt.Errorf("%w: the %s runtime reports no container logs", ErrNotImplemented, a.kind)
	}
	text, truncated, err := a.rt.Logs(ctx, t, a.cfg.MaxBytes)
	if err != nil {
		return []byte{}, false, []string{a.unavailable(r, "container logs", err)}, nil
	}
	text = linesUntil(text, t.Until)
	if len(text) > a.cfg.MaxBytes {
		text, truncated = keepTail(text, a.cfg.MaxBytes), true
	}
	return text, truncated, nil, nil
}

func (a *diagnosticsAPI) events(ctx context.Context, r *http.Request, t DiagnosticTarget, scope string) ([]byte, bool, []string, error) {
	var evs, warnings []string
	var all []Event
	if scope != EventRuntime {
		own, err := a.reg.events(t.SandboxID)
		if err != nil {
			return nil, false, nil, err
		}
		for _, e := range own {
			if (scope == "all" || e.Source == scope) && !e.Time.After(t.Until) {
				all = append(all, e)
			}
		}
	}
	if scope == EventRuntime || scope == "all" {
		switch {
		case a.rt == nil && scope == EventRuntime:
			return nil, false, nil, fmt.Errorf("%w: the %s runtime reports no events", ErrNotImplemented, a.kind)
		case a.rt == nil:
			warnings = append(warnings, "the "+a.kind+" runtime reports no events")
		default:
			rt, w, err := a.rt.Events(ctx, t)
			warnings = append(warnings, w...)
			if err != nil {
				warnings = append(warnings, a.unavailable(r, "runtime events", err))
			}
			for _, e := range rt {
				if !e.Time.After(t.Until) {
					all = append(all, e)
				}
			}
		}
	}
	slices.SortStableFunc(all, func(x, y Event) int { return x.Time.Compare(y.Time) })
	for _, e := range all {
		evs = append(evs, e.line())
	}
	text := []byte{}
	if len(evs) > 0 {
		text = []byte(strings.Join(evs, "\n") + "\n")
	}
	truncated := false
	if len(text) > a.cfg.MaxBytes {
		text, truncated = keepTail(text, a.cfg.MaxBytes), true
	}
	return text, truncated, warnings, nil
}

// unavailable is the warning for a Diagnoser error: its text when written for users,
// otherwise a pointer to the server log (where the error is logged once, here).
func (a *diagnosticsAPI) unavailable(r *http.Request, what string, err error) string {
	if errors.Is(err, ErrDiagnosticsUnavailable) {
		return what + " unavailable: " + strings.TrimPrefix(err.Error(), ErrDiagnosticsUnavailable.Error()+": ")
	}
	rid := r.Header.Get(opensandbox.HeaderRequestID)
	a.log.Error("reading sandbox diagnostics failed", "sandbox_id", r.PathValue("id"), "what", what, "request_id", rid, "err", err)
	return what + " unavailable: the " + a.kind + " runtime did not answer; see the server log for request " + rid
}

// linesUntil drops the lines whose timestamp prefix (RFC 3339) is after until; lines
// without one stay.
func linesUntil(text []byte, until time.Time) []byte {
	if until.IsZero() {
		return text
	}
	var out bytes.Buffer
	for line := range bytes.Lines(text) {
		ts, _, ok := bytes.Cut(line, []byte(" "))
		if ok {
			if at, err := time.Parse(time.RFC3339Nano, string(ts)); err == nil && at.After(until) {
				continue
			}
		}
		out.Write(line)
	}
	return out.Bytes()
}

// keepTail returns the last at most n bytes of text, from a line start when one is
// in reach.
func keepTail(text []byte, n int) []byte {
	if len(text) <= n {
		return text
	}
	tail := text[len(text)-n:]
	if i := bytes.IndexByte(tail, '\n'); i >= 0 && i+1 < len(tail) {
		tail = tail[i+1:]
	}
	return tail
}

// signature is the download URL's tag over its parameters.
func (a *diagnosticsAPI) signature(id, kind, scope, until, expires string) string {
	m := hmac.New(sha256.New, a.key)
	for _, p := range []string{"airlock diagnostics download v1", id, kind, scope, until, expires} {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// downloadURL is the absolute, signed URL of the text of kind and scope up to until,
// valid until exp.
func (a *diagnosticsAPI) downloadURL(r *http.Request, id, kind, scope string, until, exp time.Time) string {
	u, e := until.Format(time.RFC3339Nano), strconv.FormatInt(exp.Unix(), 10)
	q := url.Values{"scope": {scope}, "until": {u}, "expires": {e}, "signature": {a.signature(id, kind, scope, u, e)}}
	host := a.publicAddr
	if host == "" {
		host = r.Host
	}
	scheme := "http"
	if r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https") {
		scheme = "https"
	}
	return (&url.URL{Scheme: scheme, Host: host, Path: "/v1/sandboxes/" + id + "/diagnostics/" + kind + "/download", RawQuery: q.Encode()}).String()
}

// download serves a download URL: the text itself (text/plain), once the signature,
// the expiry and the sandbox check out. 401 for a bad or expired signature, 404 for a
// sandbox that is gone.
func (a *diagnosticsAPI) download(w http.ResponseWriter, r *http.Request) {
	id, kind, q := r.PathValue("id"), r.PathValue("kind"), r.URL.Query()
	if kind != opensandbox.DiagnosticLogs && kind != opensandbox.DiagnosticEvents {
		fail(a.log, w, r, fmt.Errorf("%w: %s %s", ErrNoRoute, r.Method, r.URL.Path))
		return
	}
	scope, u, e := q.Get("scope"), q.Get("until"), q.Get("expires")
	want := a.signature(id, kind, scope, u, e)
	if !hmac.Equal([]byte(want), []byte(q.Get("signature"))) {
		fail(a.log, w, r, fmt.Errorf("%w: the diagnostics download URL is not valid", ErrUnauthorized))
		return
	}
	secs, err1 := strconv.ParseInt(e, 10, 64)
	until, err2 := time.Parse(time.RFC3339Nano, u)
	if err1 != nil || err2 != nil || time.Now().Unix() > secs {
		fail(a.log, w, r, fmt.Errorf("%w: the diagnostics download URL has expired; ask for a new one", ErrUnauthorized))
		return
	}
	if err := checkScope(kind, scope); err != nil {
		fail(a.log, w, r, err)
		return
	}
	text, truncated, _, err := a.render(r, id, kind, scope, until)
	if err != nil {
		fail(a.log, w, r, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", opensandbox.DiagnosticContentType)
	h.Set("Content-Length", strconv.Itoa(len(text)))
	h.Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", id+"-"+kind+".txt"))
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Airlock-Truncated", strconv.FormatBool(truncated))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(text)
}

// diagTarget implements diagRecords.
func (s *Server) diagTarget(id string) (DiagnosticTarget, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if !ok {
		return DiagnosticTarget{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	img := e.rec.Image
	if local, ok := s.cfg.ImageAliases[img]; ok {
		img = local
	}
	return DiagnosticTarget{SandboxID: id, ContainerID: e.rec.ContainerID, Image: img, Since: e.rec.CreatedAt}, nil
}

// TailBuffer is an io.Writer that keeps the newest Max bytes written (at most about
// twice that in memory) and counts the lines; Bytes returns them from a line start and
// reports whether anything older was dropped. Diagnoser implementations use it to read logs.
type TailBuffer struct {
	Max     int
	buf     []byte
	dropped bool
	lines   int
}

// Write implements io.Writer; it never fails.
func (b *TailBuffer) Write(p []byte) (int, error) {
	for _, c := range p {
		if c == '\n' {
			b.lines++
		}
	}
	b.buf = append(b.buf, p...)
	if b.Max > 0 && len(b.buf) > 2*b.Max {
		b.buf = append(b.buf[:0:0], b.buf[len(b.buf)-b.Max:]...)
		b.dropped = true
	}
	return len(p), nil
}

// Lines is how many newlines were written.
func (b *TailBuffer) Lines() int { return b.lines }

// Bytes returns the newest at most Max bytes, from a line start when text was dropped,
// and whether anything was dropped.
func (b *TailBuffer) Bytes() ([]byte, bool) {
	text, dropped := b.buf, b.dropped
	if b.Max > 0 && len(text) > b.Max {
		text, dropped = text[len(text)-b.Max:], true
	}
	if dropped {
		if i := bytes.IndexByte(text, '\n'); i >= 0 && i+1 < len(text) {
			text = text[i+1:]
		}
	}
	return text, dropped
}
