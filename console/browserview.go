package console

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
)

// browserPage is one DevTools target of a browser sandbox, as the console shows it.
type browserPage struct {
	ID    string `json:"id"`
	Type  string `json:"type"`
	Title string `json:"title"`
	URL   string `json:"url"`
	// Host is the URL's host name for http and https ("" for about:, data: and the like).
	Host string `json:"host"`
}

// browserView is the body of GET /console/api/sandboxes/{id}/browser.
type browserView struct {
	// Available is false when the sandbox's port 9222 does not answer DevTools'
	// /json/list (not a browser sandbox, or Chromium not up yet); Message says why.
	Available bool          `json:"available"`
	Message   string        `json:"message,omitempty"`
	Pages     []browserPage `json:"pages"`
	// Hosts are the distinct hosts of Pages, sorted.
	Hosts []string `json:"hosts"`
}

// browserListTimeout bounds the /json/list call through the server proxy.
const browserListTimeout = 3 * time.Second

// browserListMax is the most of a /json/list answer read (the gateway's rewrite limit).
const browserListMax = 1 << 20

// browserUI are the URL schemes of Chromium's own UI targets, left out of the list.
var browserUI = map[string]bool{"chrome": true, "chrome-untrusted": true, "devtools": true}

// handleBrowser answers GET /console/api/sandboxes/{id}/browser: the pages the
// sandbox's Chromium has open (DevTools' /json/list on opensandbox.CDPPort, without
// Chromium's own chrome:// UI targets) with their hosts. It asks the API for the port's endpoint with the session's key first, so a
// principal that may not reach the sandbox gets the API's answer (404, 403), then calls
// lifecycle's server proxy in-process with the sandbox's credential from that answer:
// the same credential check as any client, and nothing of it reaches the page.
func (c *Console) handleBrowser(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var ep struct {
		Headers map[string]string `json:"headers"`
	}
	if err := c.apiGet(r.Context(), "/v1/sandboxes/"+url.PathEscape(id)+"/endpoints/"+strconv.Itoa(opensandbox.CDPPort), &ep); err != nil {
		writeAPIError(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), browserListTimeout)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodGet,
		"/sandboxes/"+url.PathEscape(id)+"/proxy/"+strconv.Itoa(opensandbox.CDPPort)+"/json/list", nil)
	req.RemoteAddr = "127.0.0.1:0"
	for k, v := range ep.Headers {
		req.Header.Set(k, v)
	}
	if s := sessionOf(r); s != nil && s.apiKey != "" {
		req.Header.Set(opensandbox.HeaderAPIKey, s.apiKey)
	}
	rec := httptest.NewRecorder()
	c.cfg.API.ServeHTTP(rec, req)
	view := browserView{Pages: []browserPage{}, Hosts: []string{}}
	var list []browserPage
	switch {
	case rec.Code != http.StatusOK:
		view.Message = "DevTools (port " + strconv.Itoa(opensandbox.CDPPort) + ") answered " + strconv.Itoa(rec.Code) + ": not a browser sandbox, or Chromium is not up"
	case rec.Body.Len() > browserListMax:
		view.Message = "DevTools' page list is larger than 1 MiB"
	case json.Unmarshal(rec.Body.Bytes(), &list) != nil:
		view.Message = "DevTools answered a page list that is not JSON"
	default:
		view.Available = true
		for _, p := range list {
			u, err := url.Parse(p.URL)
			if err == nil && browserUI[u.Scheme] {
				continue // Chromium's own UI (the omnibox popup, …), not a page
			}
			if err == nil && (u.Scheme == "http" || u.Scheme == "https") {
				p.Host = u.Hostname()
			}
			view.Pages = append(view.Pages, p)
			if p.Host != "" && !slices.Contains(view.Hosts, p.Host) {
				view.Hosts = append(view.Hosts, p.Host)
			}
		}
		slices.Sort(view.Hosts)
	}
	opensandbox.WriteJSON(w, http.StatusOK, view)
}
