// Package pathform hardens the path-form routes to sandbox ports, which put every sandbox
// under one browser origin: the gateway's path forms and lifecycle's server proxy both
// use it (docs/architecture.md, "One origin per sandbox port").
package pathform

import (
	"mime"
	"net/http"
	"strings"
)

// Path forms (/sandboxes/<id>/proxy/<port>/…, /<id>/<port>/…, signed /<id>/<port>/<exp>/<tag>/…)
// put every sandbox port under one browser origin (the gateway's, or lifecycle's API
// address for its server proxy). They are hardened so code in one sandbox cannot reach the
// others, or the console, through the browser:
//
//   - a service worker script request (`Service-Worker: script`) is refused with 403, so no
//     sandbox registers a worker that would control the shared origin;
//   - `Service-Worker-Allowed` is removed from responses;
//   - `Set-Cookie` loses its Domain attribute, and a Path outside the route's prefix is
//     rewritten under it (Path=/x becomes Path=<prefix>/x; no Path becomes <prefix>/);
//   - document responses (HTML, XHTML, SVG, XML, or no Content-Type, which browsers sniff)
//     get `Content-Security-Policy: sandbox …` without allow-same-origin: the page runs
//     with an opaque origin and cannot read other sandboxes' responses or use the shared
//     origin's cookies, storage or service workers.
//
// Host and header forms are left alone: each sandbox port is its own origin there.
//
// Refuse reports whether a request must be refused (a service worker script fetch);
// Harden rewrites a response's headers.

// HeaderServiceWorker is the request header browsers send on service worker script
// fetches (Service Workers, §"Service-Worker" header), with the value "script".
const HeaderServiceWorker = "Service-Worker"

// CSP is the Content-Security-Policy added to document responses of path forms: scripts, forms, popups, modals and downloads work; allow-same-origin is
// withheld, so the document has an opaque origin.
const CSP = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"

var csp = []string{CSP}

// RefuseReason is the reason given (in the 403 body and the audit record) for a refused
// service worker script fetch.
const RefuseReason = "service workers are refused on path-form routes, which share one origin; use the host form <port>-<id>.<base domain>"

// Refuse reports whether r is a service worker script fetch, which a path-form route
// answers with 403 Forbidden (RefuseReason).
func Refuse(r *http.Request) bool { return r.Header.Get(HeaderServiceWorker) != "" }

// Harden rewrites the response headers h of a path-form route whose escaped path prefix
// is prefix (no trailing slash, for example "/sandboxes/<id>/proxy/8080").
func Harden(h http.Header, prefix string) {
	delete(h, "Service-Worker-Allowed")
	if cs := h["Set-Cookie"]; len(cs) > 0 {
		out := make([]string, len(cs))
		for i, c := range cs {
			out[i] = scopeCookie(c, prefix)
		}
		h["Set-Cookie"] = out
	}
	if isDocument(h.Get("Content-Type")) {
		h["Content-Security-Policy"] = append(h["Content-Security-Policy"], csp...)
	}
}

// scopeCookie returns the Set-Cookie value c without Domain attributes and with a Path
// inside prefix: a Path already equal to prefix or under prefix+"/" stays; another Path p
// (the application's own view, which never sees the prefix) becomes prefix+p; a missing
// or relative Path becomes prefix+"/" (the browser's default would be the request's
// directory, which for ".../proxy/8080" lies outside the prefix). RFC 6265 §5.2: the last
// Path attribute counts; attribute names are case-insensitive.
func scopeCookie(c, prefix string) string {
	parts := strings.Split(c, ";")
	kept := parts[:1]
	path := ""
	for _, a := range parts[1:] {
		name, val, _ := strings.Cut(a, "=")
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "path":
			path = strings.TrimSpace(val)
		case "domain":
		default:
			kept = append(kept, a)
		}
	}
	switch {
	case path == prefix || strings.HasPrefix(path, prefix+"/"):
	case strings.HasPrefix(path, "/"):
		path = prefix + path
	default:
		path = prefix + "/"
	}
	return strings.Join(kept, ";") + "; Path=" + path
}

// isDocument reports whether a response of Content-Type ct can be a document that runs
// script when a browser navigates to it: HTML, XHTML, SVG and other XML, or no type at
// all (browsers, and Go's server, sniff one).
func isDocument(ct string) bool {
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return true
	}
	switch mt {
	case "text/html", "application/xhtml+xml", "image/svg+xml", "text/xml", "application/xml":
		return true
	}
	return strings.HasSuffix(mt, "+xml")
}
