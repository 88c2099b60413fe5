package watch

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// Handler receives the watch stream's effect on the set of sandboxes. Calls come from one
// goroutine, in order. A handler must not block for long: the stream waits for it.
type Handler interface {
	// Replace installs the complete set after a snapshot; sandboxes the handler holds
	// that are not in all are gone.
	Replace(all []Sandbox, rv uint64)
	// Upsert adds or replaces one sandbox.
	Upsert(s Sandbox, rv uint64)
	// Delete removes one sandbox.
	Delete(id string, rv uint64)
}

// ClientConfig configures a Client.
type ClientConfig struct {
	// URL is the watch endpoint, for example http://127.0.0.1:8080/internal/v1/watch.
	URL string
	// Header is sent with every request (the credential, for example
	// OPEN-SANDBOX-API-KEY or Authorization).
	Header http.Header
	// HTTPClient defaults to a client with no overall timeout (the stream is long-lived).
	HTTPClient *http.Client
	// FallbackURL, when set, is followed while URL cannot be reached (its connection
	// or its answer fails): on Kubernetes, the Service of every lifecycle replica
	// behind URL's Service of the leading replica alone. A stream on FallbackURL ends
	// after FallbackTime (default 30 s) so that URL is tried again; the switch loses no
	// event (a stream that cannot resume where the last one ended starts with a
	// snapshot).
	FallbackURL  string
	FallbackTime time.Duration
	// MaxBackoff caps the wait between reconnects; default 5 s.
	MaxBackoff time.Duration
	Log        *slog.Logger
}

// Client follows a watch stream, reconnecting and resuming on failure.
type Client struct {
	cfg ClientConfig

	mu        sync.Mutex
	epoch     string
	rv        uint64
	synced    bool
	lastEvent time.Time
	lag       time.Duration
	connected bool
	reconnect int
}

// NewClient validates cfg and returns a Client; it does no I/O.
func NewClient(cfg ClientConfig) (*Client, error) {
	for _, raw := range []string{cfg.URL, cfg.FallbackURL} {
		if raw == "" && raw != cfg.URL {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("watch: invalid URL %q: want http(s)://host[:port]/path", raw)
		}
	}
	if cfg.FallbackTime <= 0 {
		cfg.FallbackTime = 30 * time.Second
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Client{cfg: cfg}, nil
}

// Status is a point-in-time view of the client for health and metrics.
type Status struct {
	Connected bool
	// Synced is true once a snapshot has been applied (the data is usable).
	Synced          bool
	ResourceVersion uint64
	// Lag is the age of the last change event when it was applied.
	Lag        time.Duration
	LastEvent  time.Time
	Reconnects int
}

// Status returns the client's current status.
func (c *Client) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Status{Connected: c.connected, Synced: c.synced, ResourceVersion: c.rv,
		Lag: c.lag, LastEvent: c.lastEvent, Reconnects: c.reconnect}
}

// Run follows the stream until ctx ends, feeding h. It returns ctx's error. Between
// connections h keeps what it has: the data plane serves known sandboxes while lifecycle
// is unreachable.
func (c *Client) Run(ctx context.Context, h Handler) error {
	backoff := 100 * time.Millisecond
	for {
		start := time.Now()
		connected, err := c.stream(ctx, h, c.cfg.URL)
		if !connected && c.cfg.FallbackURL != "" && ctx.Err() == nil {
			c.cfg.Log.Info("watch: following the fallback while the first URL is unreachable", "err", err,
				"fallback_s", c.cfg.FallbackTime.Seconds())
			fctx, cancel := context.WithTimeout(ctx, c.cfg.FallbackTime)
			connected, err = c.stream(fctx, h, c.cfg.FallbackURL)
			cancel()
			if connected && ctx.Err() == nil && fctx.Err() != nil {
				err = nil // its time was up: back to the first URL, at once
				backoff = 0
			}
		}
		c.mu.Lock()
		c.connected = false
		c.mu.Unlock()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Since(start) > 30*time.Second {
			backoff = 100 * time.Millisecond
		}
		if err != nil {
			c.cfg.Log.Warn("watch stream ended, reconnecting", "err", err, "backoff_ms", backoff.Milliseconds())
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		backoff = max(min(backoff*2, c.cfg.MaxBackoff), 100*time.Millisecond)
		c.mu.Lock()
		c.reconnect++
		c.mu.Unlock()
	}
}

// errStream marks a malformed or out-of-order stream.
var errStream = errors.New("watch: malformed stream")

// stream follows one connection to rawURL until it ends; connected reports whether
// the server answered 200.
func (c *Client) stream(ctx context.Context, h Handler, rawURL string) (connected bool, err error) {
	c.mu.Lock()
	epoch, rv := c.epoch, c.rv
	c.mu.Unlock()

	u, _ := url.Parse(rawURL)
	q := u.Query()
	if epoch != "" {
		q.Set("epoch", epoch)
		q.Set("resourceVersion", strconv.FormatUint(rv, 10))
	}
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return false, err
	}
	for k, v := range c.cfg.Header {
		req.Header[k] = v
	}
	resp, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("watch: server answered %s", resp.Status)
	}
	c.mu.Lock()
	c.connected = true
	c.mu.Unlock()

	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	var snapshot map[string]Sandbox // non-nil between RESET and SYNCED
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return true, fmt.Errorf("%w: %v", errStream, err)
		}
		switch ev.Type {
		case Reset:
			snapshot = make(map[string]Sandbox)
		case Added, Modified:
			if ev.Sandbox == nil {
				return true, fmt.Errorf("%w: %s without sandbox", errStream, ev.Type)
			}
			if snapshot != nil {
				snapshot[ev.Sandbox.ID] = *ev.Sandbox
				continue
			}
			h.Upsert(*ev.Sandbox, ev.ResourceVersion)
		case Deleted:
			if ev.Sandbox == nil {
				return true, fmt.Errorf("%w: DELETED without sandbox", errStream)
			}
			if snapshot != nil {
				delete(snapshot, ev.Sandbox.ID)
				continue
			}
			h.Delete(ev.Sandbox.ID, ev.ResourceVersion)
		case Synced:
			if snapshot != nil {
				all := make([]Sandbox, 0, len(snapshot))
				for _, s := range snapshot {
					all = append(all, s)
				}
				h.Replace(all, ev.ResourceVersion)
				snapshot = nil
			}
			c.mu.Lock()
			c.epoch, c.synced = ev.Epoch, true
			c.mu.Unlock()
		case Bookmark:
		default:
			c.cfg.Log.Debug("watch event of unknown type ignored", "type", ev.Type)
			continue
		}
		c.mu.Lock()
		if snapshot == nil {
			c.rv = ev.ResourceVersion
		}
		if !ev.Time.IsZero() && ev.Type != Bookmark {
			c.lag = time.Since(ev.Time)
		}
		c.lastEvent = time.Now()
		c.mu.Unlock()
	}
	if err := sc.Err(); err != nil {
		return true, err
	}
	return true, errors.New("watch: stream closed by server")
}
