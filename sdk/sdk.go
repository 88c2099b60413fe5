// Package sdk is a Go client for Airlock, and for any server speaking the OpenSandbox
// lifecycle API (docs/spec/sandbox-lifecycle.yml) and execd API
// (execd-api.yaml): create, list, get, kill, renew, pause and resume sandboxes, find
// their endpoints, then run commands with streamed output, use bash sessions, move files
// and run code in stateful contexts through the sandbox's execd.
//
//	c, _ := sdk.New(sdk.Config{BaseURL: "http://127.0.0.1:8080", APIKey: key})
//	sb, _ := c.Create(ctx, sdk.CreateRequest{Image: "airlock/sandbox:latest", Timeout: 10 * time.Minute})
//	x, _ := c.Execd(ctx, sb.ID)
//	_ = x.WaitReady(ctx)
//	ex, _ := x.Run(ctx, sdk.Command{Command: "echo hi"}, nil)
//	fmt.Println(ex.Stdout) // [hi]
//
// Every method takes a context; errors from the server are *APIError.
package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
)

// DefaultBaseURL is where `airlock up` listens by default.
const DefaultBaseURL = "http://127.0.0.1:8080"

// Config configures a Client.
type Config struct {
	// BaseURL is the lifecycle server, with or without /v1; default DefaultBaseURL.
	BaseURL string
	// APIKey is sent as OPEN-SANDBOX-API-KEY; empty sends none.
	APIKey string
	// HTTPClient defaults to a client without an overall timeout (streams are long);
	// bound calls with their context.
	HTTPClient *http.Client
	// Header is added to every request (lifecycle and execd).
	Header http.Header
}

// Client talks to the lifecycle API. It is safe for concurrent use.
type Client struct {
	base   string // ends in /v1
	key    string
	hc     *http.Client
	header http.Header
}

// New returns a Client; it performs no I/O.
func New(cfg Config) (*Client, error) {
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	u, err := url.Parse(strings.TrimRight(cfg.BaseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("sdk: base URL %q: want http(s)://host[:port]", cfg.BaseURL)
	}
	base := u.String()
	if !strings.HasSuffix(base, "/v1") {
		base += "/v1"
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	return &Client{base: base, key: cfg.APIKey, hc: cfg.HTTPClient, header: cfg.Header.Clone()}, nil
}

// APIError is a non-2xx answer: its status, the server's {code, message} (the
// opensandbox.ErrorBody envelope) and the request id it echoed (X-Request-Id, else the
// body's requestId).
type APIError struct {
	Status    int
	Code      string
	Message   string
	RequestID string
}

func (e *APIError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("HTTP %d: %s", e.Status, e.Message)
	}
	return fmt.Sprintf("%s (HTTP %d): %s", e.Code, e.Status, e.Message)
}

// IsNotFound reports whether err is a 404 answer.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

// do sends a request to base+path with body JSON-encoded (nil: none) and decodes a 2xx
// JSON answer into out (nil: discarded).
func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	resp, err := c.send(ctx, method, c.base+path, body, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeResponse(resp, out)
}

func (c *Client) send(ctx context.Context, method, u string, body any, hdr http.Header) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	for k, vs := range c.header {
		req.Header[k] = vs
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	if c.key != "" {
		req.Header.Set(opensandbox.HeaderAPIKey, c.key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return c.hc.Do(req)
}

func decodeResponse(resp *http.Response, out any) error {
	if resp.StatusCode/100 != 2 {
		return apiError(resp)
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("sdk: decoding %s answer: %w", resp.Request.URL.Path, err)
	}
	return nil
}

func apiError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &APIError{Status: resp.StatusCode, RequestID: resp.Header.Get(opensandbox.HeaderRequestID)}
	var body opensandbox.ErrorBody
	if json.Unmarshal(b, &body) == nil && (body.Code != "" || body.Message != "") {
		e.Code, e.Message = body.Code, body.Message
		if e.RequestID == "" {
			e.RequestID = body.RequestID
		}
	} else {
		e.Message = strings.TrimSpace(string(b))
		if e.Message == "" {
			e.Message = http.StatusText(resp.StatusCode)
		}
	}
	return e
}

// Status is a sandbox's lifecycle status.
type Status struct {
	State            opensandbox.State `json:"state"`
	Reason           string            `json:"reason,omitempty"`
	Message          string            `json:"message,omitempty"`
	LastTransitionAt time.Time         `json:"lastTransitionAt"`
}

// Sandbox is a sandbox as the server reports it.
type Sandbox struct {
	ID    string `json:"id"`
	Image *struct {
		URI string `json:"uri"`
	} `json:"image,omitempty"`
	Status     Status            `json:"status"`
	Metadata   map[string]string `json:"metadata"`
	Entrypoint []string          `json:"entrypoint"`
	// ExpiresAt is nil for manual cleanup.
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
	CreatedAt time.Time  `json:"createdAt"`
	// Airlock holds Airlock's additions (absent on other OpenSandbox servers):
	// CreatedBy is the id of the principal whose key created the sandbox.
	Airlock *struct {
		CreatedBy string `json:"createdBy,omitempty"`
	} `json:"airlock,omitempty"`
}

// Volume mounts storage into a new sandbox: a host path or a named volume.
type Volume struct {
	Name      string `json:"name"`
	MountPath string `json:"mountPath"`
	ReadOnly  bool   `json:"readOnly,omitempty"`
	SubPath   string `json:"subPath,omitempty"`
	HostPath  string `json:"-"`
	Named     string `json:"-"`
	// DeleteWithSandbox removes a named volume the server created for this sandbox.
	DeleteWithSandbox bool `json:"-"`
}

// CreateRequest describes a new sandbox.
type CreateRequest struct {
	// Image is required.
	Image string
	// Entrypoint defaults to ["tail", "-f", "/dev/null"].
	Entrypoint []string
	// Timeout is the time to live (whole seconds, at least a minute); zero means manual
	// cleanup (no expiry).
	Timeout time.Duration
	// Resources are limits such as {"cpu": "1", "memory": "2Gi"}; default those two.
	Resources map[string]string
	Env       map[string]string
	Metadata  map[string]string
	// NetworkPolicy is an egress policy document ({defaultAction, egress:[...]}).
	NetworkPolicy json.RawMessage
	SecureAccess  bool
	// CredentialProxy is credentialProxy.enabled: the sandbox's HTTP(S) to destinations
	// bound in its Credential Vault (Client.Vault) gets their credentials injected.
	CredentialProxy bool
	Volumes         []Volume
	Extensions      map[string]string
}

func (r CreateRequest) wire() map[string]any {
	ep := r.Entrypoint
	if len(ep) == 0 {
		ep = []string{"tail", "-f", "/dev/null"}
	}
	res := r.Resources
	if res == nil {
		res = map[string]string{"cpu": "1", "memory": "2Gi"}
	}
	m := map[string]any{
		"image":          map[string]string{"uri": r.Image},
		"entrypoint":     ep,
		"resourceLimits": res,
		"env":            nonNil(r.Env),
		"metadata":       nonNil(r.Metadata),
		"extensions":     nonNil(r.Extensions),
		"secureAccess":   r.SecureAccess,
	}
	if r.Timeout > 0 {
		m["timeout"] = int64(r.Timeout / time.Second)
	}
	if len(r.NetworkPolicy) > 0 {
		m["networkPolicy"] = r.NetworkPolicy
	}
	if r.CredentialProxy {
		m["credentialProxy"] = map[string]bool{"enabled": true}
	}
	var vols []map[string]any
	for _, v := range r.Volumes {
		w := map[string]any{"name": v.Name, "mountPath": v.MountPath, "readOnly": v.ReadOnly}
		if v.SubPath != "" {
			w["subPath"] = v.SubPath
		}
		if v.HostPath != "" {
			w["host"] = map[string]string{"path": v.HostPath}
		}
		if v.Named != "" {
			w["pvc"] = map[string]any{"claimName": v.Named, "deleteOnSandboxTermination": v.DeleteWithSandbox}
		}
		vols = append(vols, w)
	}
	if vols != nil {
		m["volumes"] = vols
	}
	return m
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// Create creates a sandbox; it answers at once in state Pending (see WaitReady).
func (c *Client) Create(ctx context.Context, r CreateRequest) (*Sandbox, error) {
	var sb Sandbox
	if err := c.do(ctx, http.MethodPost, "/sandboxes", r.wire(), &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Get returns one sandbox.
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ListOptions filters a list: any of States, all of Metadata. Page starts at 1;
// PageSize defaults to the server's (20).
type ListOptions struct {
	States   []string
	Metadata map[string]string
	Page     int
	PageSize int
}

// Page is one page of sandboxes.
type Page struct {
	Items      []Sandbox `json:"items"`
	Pagination struct {
		Page        int  `json:"page"`
		PageSize    int  `json:"pageSize"`
		TotalItems  int  `json:"totalItems"`
		TotalPages  int  `json:"totalPages"`
		HasNextPage bool `json:"hasNextPage"`
	} `json:"pagination"`
}

// List returns one page of sandboxes.
func (c *Client) List(ctx context.Context, o ListOptions) (*Page, error) {
	q := url.Values{}
	for _, s := range o.States {
		q.Add("state", s)
	}
	if len(o.Metadata) > 0 {
		md := url.Values{}
		for k, v := range o.Metadata {
			md.Set(k, v)
		}
		q.Set("metadata", md.Encode())
	}
	if o.Page > 0 {
		q.Set("page", strconv.Itoa(o.Page))
	}
	if o.PageSize > 0 {
		q.Set("pageSize", strconv.Itoa(o.PageSize))
	}
	var p Page
	if err := c.do(ctx, http.MethodGet, "/sandboxes?"+q.Encode(), nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Kill deletes a sandbox (also when paused).
func (c *Client) Kill(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil, nil)
}

// Pause freezes a running sandbox.
func (c *Client) Pause(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/pause", nil, nil)
}

// Resume thaws a paused sandbox.
func (c *Client) Resume(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/resume", nil, nil)
}

// Renew sets the sandbox's expiry to at and returns the server's value.
func (c *Client) Renew(ctx context.Context, id string, at time.Time) (time.Time, error) {
	var out struct {
		ExpiresAt time.Time `json:"expiresAt"`
	}
	err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/renew-expiration",
		map[string]time.Time{"expiresAt": at.UTC()}, &out)
	return out.ExpiresAt, err
}

// RevokeSignedURLs makes every signed URL minted so far for the sandbox stop working
// (Airlock extension POST /sandboxes/{id}/signed-urls/revoke) and returns the sandbox's
// new signed-URL epoch. Signed URLs minted afterwards work.
func (c *Client) RevokeSignedURLs(ctx context.Context, id string) (uint64, error) {
	var out struct {
		SignedURLEpoch uint64 `json:"signedUrlEpoch"`
	}
	err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/signed-urls/revoke", nil, &out)
	return out.SignedURLEpoch, err
}

// PatchMetadata merges patch into the sandbox's metadata (a nil value deletes the key)
// and returns the sandbox.
func (c *Client) PatchMetadata(ctx context.Context, id string, patch map[string]*string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.do(ctx, http.MethodPatch, "/sandboxes/"+url.PathEscape(id)+"/metadata", patch, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Endpoint is where a sandbox port is reached: Endpoint is host[:port][/path] without
// scheme; Headers must be sent with every request to it.
type Endpoint struct {
	Endpoint string            `json:"endpoint"`
	Headers  map[string]string `json:"headers,omitempty"`
}

// URL returns the endpoint as an http:// URL (the scheme of the lifecycle server).
func (e Endpoint) URL(scheme string) string { return scheme + "://" + e.Endpoint }

// Endpoint returns the endpoint of port in sandbox id.
func (c *Client) Endpoint(ctx context.Context, id string, port int) (*Endpoint, error) {
	var ep Endpoint
	if err := c.do(ctx, http.MethodGet, fmt.Sprintf("/sandboxes/%s/endpoints/%d", url.PathEscape(id), port), nil, &ep); err != nil {
		return nil, err
	}
	return &ep, nil
}

// WaitState polls the sandbox every interval until it is in state, the context ends,
// or it reaches a terminal state (Failed or Terminated).
func (c *Client) WaitState(ctx context.Context, id string, state opensandbox.State, interval time.Duration) (*Sandbox, error) {
	for {
		sb, err := c.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if sb.Status.State == state {
			return sb, nil
		}
		if sb.Status.State.Terminal() {
			return sb, fmt.Errorf("sdk: sandbox %s is %s: %s", id, sb.Status.State, sb.Status.Message)
		}
		select {
		case <-ctx.Done():
			return sb, ctx.Err()
		case <-time.After(interval):
		}
	}
}
