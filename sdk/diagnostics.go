package sdk

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/airlockdev/airlock/opensandbox"
)

// DiagnosticOptions select a diagnostic payload (docs/spec/diagnostic-api.yml).
type DiagnosticOptions struct {
	// Scope is required by the spec. Airlock serves logs scopes "container" and "all",
	// events scopes "lifecycle", "network", "runtime" and "all".
	Scope string
	// Delivery asks for "inline" or "url" (an Airlock extension); empty lets the server
	// choose by size.
	Delivery string
}

// Diagnostics returns the descriptor of sandbox id's diagnostic text of kind
// (opensandbox.DiagnosticLogs or opensandbox.DiagnosticEvents): GET
// /sandboxes/{id}/diagnostics/{kind}?scope=. DiagnosticText reads its text.
func (c *Client) Diagnostics(ctx context.Context, id, kind string, o DiagnosticOptions) (*opensandbox.DiagnosticContent, error) {
	q := url.Values{"scope": {o.Scope}}
	if o.Delivery != "" {
		q.Set("delivery", o.Delivery)
	}
	var d opensandbox.DiagnosticContent
	if err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/diagnostics/"+url.PathEscape(kind)+"?"+q.Encode(), nil, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// maxDiagnosticDownload bounds a downloaded payload (the server's own limit is 4 MiB
// by default).
const maxDiagnosticDownload = 64 << 20

// DiagnosticText returns d's text: its content when inline, else the body of its
// contentUrl, fetched without the API key or the Config's headers (the URL is its own
// credential and may point at another host). A non-2xx download is *APIError.
func (c *Client) DiagnosticText(ctx context.Context, d *opensandbox.DiagnosticContent) (string, error) {
	if d.Delivery != opensandbox.DeliveryURL {
		if d.Content == nil {
			return "", nil
		}
		return *d.Content, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.ContentURL, nil)
	if err != nil {
		return "", fmt.Errorf("sdk: diagnostic content URL: %w", err)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return "", apiError(resp)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxDiagnosticDownload))
	if err != nil {
		return "", fmt.Errorf("sdk: downloading diagnostic text: %w", err)
	}
	return string(b), nil
}
