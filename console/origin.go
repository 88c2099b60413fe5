package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// originCheck decides whether a state-changing request comes from the console's own
// pages. Browsers send Sec-Fetch-Site (Fetch Metadata,
// https://www.w3.org/TR/fetch-metadata/#sec-fetch-site-header) and Origin (RFC 6454
// §7; sent on every non-GET fetch and form POST) on such requests:
//
//   - Sec-Fetch-Site, when present, must be "same-origin";
//   - Origin, when present, must be the request's own origin (scheme from the
//     connection, host from the Host header) or a trusted one; "null" never is;
//   - a request with neither is refused (no browser sends such a write).
type originCheck struct {
	trusted map[string]bool
}

func newOriginCheck(trusted []string) (originCheck, error) {
	o := originCheck{trusted: map[string]bool{}}
	for _, t := range trusted {
		u, err := url.Parse(t)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return o, fmt.Errorf("console: trusted origin %q: want scheme://host[:port]", t)
		}
		o.trusted[u.Scheme+"://"+strings.ToLower(u.Host)] = true
	}
	return o, nil
}

var (
	errCrossSite = errors.New("cross-origin request refused (Sec-Fetch-Site is not same-origin)")
	errOrigin    = errors.New("cross-origin request refused (Origin does not match)")
	errNoOrigin  = errors.New("request without Origin or Sec-Fetch-Site refused")
)

// check returns nil for a same-origin request, else why not.
func (o originCheck) check(r *http.Request) error {
	site := r.Header.Get("Sec-Fetch-Site")
	origin := r.Header.Get("Origin")
	if site == "" && origin == "" {
		return errNoOrigin
	}
	if site != "" && site != "same-origin" {
		return errCrossSite
	}
	if origin != "" {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		own := scheme + "://" + strings.ToLower(r.Host)
		if o2 := strings.ToLower(origin); o2 != own && !o.trusted[o2] {
			return errOrigin
		}
	}
	return nil
}
