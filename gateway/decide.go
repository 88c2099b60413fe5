package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/airlockdev/airlock/gateway/route"
	"github.com/airlockdev/airlock/gateway/routetable"
	"github.com/airlockdev/airlock/gateway/signedurl"
	"github.com/airlockdev/airlock/lifecycle/watch"
)

// Access headers: the sandbox's token, under the Airlock name or the OpenSandbox one
// (OSEP-0011 "OPENSANDBOX-SECURE-ACCESS"). Both are removed before proxying.
const (
	HeaderAccessToken  = "X-Airlock-Access-Token"
	HeaderSecureAccess = "Opensandbox-Secure-Access"
	HeaderRequestID    = "X-Request-Id"
)

// strippedHeaders never reach a sandbox: they carry routing and credentials for the
// gateway only.
var strippedHeaders = []string{route.HeaderIngressTo, route.HeaderSandbox, route.HeaderPort,
	HeaderAccessToken, HeaderSecureAccess}

// decision is the outcome of routing and admitting one request. A deny is a value: err is
// one of the sentinel errors and reason the message for the client.
type decision struct {
	cand   route.Candidate
	entry  *routetable.Entry
	sb     *watch.Sandbox
	mode   watch.AccessMode
	dial   string // upstream host:port
	access string // how the request was admitted: public, token, signed

	err        error
	reason     string
	retryAfter int
}

// decider routes and admits requests against a route table. decide performs no I/O.
type decider struct {
	table   *routetable.Table
	keys    *signedurl.Keyring // nil: no signed routes verify
	domains []string
	// synced reports whether the table holds a complete snapshot; before that an unknown
	// sandbox is "not loaded yet" (503), not "not found". nil means always synced.
	synced func() bool
}

func (d *decider) decide(r *http.Request, now time.Time) decision {
	var buf [route.MaxCandidates]route.Candidate
	_, hasSandbox := r.Header[route.HeaderSandbox]
	_, hasPort := r.Header[route.HeaderPort]
	in := route.Input{
		Host:       r.Host,
		Path:       r.URL.EscapedPath(),
		IngressTo:  r.Header.Get(route.HeaderIngressTo),
		Sandbox:    r.Header.Get(route.HeaderSandbox),
		Port:       r.Header.Get(route.HeaderPort),
		HasAirlock: hasSandbox || hasPort,
	}
	cands, err := route.Parse(in, d.domains, buf[:0])
	if err != nil {
		msg := "malformed sandbox route"
		if errors.Is(err, route.ErrNoRoute) {
			msg = "the request names no sandbox: use <port>-<id>.<base domain>, the OpenSandbox-Ingress-To header or /sandboxes/<id>/proxy/<port>/"
		}
		return decision{err: ErrBadRoute, reason: msg}
	}

	var dec decision
	found := false
	for _, c := range cands {
		e, ok := d.table.Lookup(c.ID)
		if !ok {
			continue
		}
		sb := e.Sandbox()
		mode := sb.Access.ModeFor(c.Port)
		// OSEP-0011: on a public port, signed-looking path segments are the app's own path.
		if c.Signed && c.Form == route.FormPath && mode == watch.Public {
			continue
		}
		dec = decision{cand: c, entry: e, sb: sb, mode: mode}
		found = true
		break
	}
	if !found {
		dec.cand = cands[0]
		for _, c := range cands {
			if d.table.Gone(c.ID, now) {
				dec.cand = c
				return dec.deny(ErrGone, fmt.Sprintf("sandbox %s was deleted", c.ID))
			}
		}
		if d.synced != nil && !d.synced() {
			dec.retryAfter = 1
			return dec.deny(ErrNotReady, "the gateway has not loaded its route table from lifecycle yet")
		}
		return dec.deny(ErrNotFound, fmt.Sprintf("sandbox %s not found", dec.cand.ID))
	}

	sb := dec.sb
	switch sb.State {
	case "Stopping", "Terminated", "Failed":
		return dec.deny(ErrGone, fmt.Sprintf("sandbox %s is %s", sb.ID, sb.State))
	}
	if sb.ExpiresAt != nil && now.After(*sb.ExpiresAt) {
		return dec.deny(ErrGone, fmt.Sprintf("sandbox %s expired at %s", sb.ID, sb.ExpiresAt.UTC().Format(time.RFC3339)))
	}
	if err, reason := d.admit(&dec, r.Header, now); err != nil {
		return dec.deny(err, reason)
	}
	dec.dial = dec.entry.Dial(dec.cand.Port)
	if sb.State != "Running" || dec.dial == "" {
		dec.retryAfter = 2
		state := sb.State
		if state == "" {
			state = "not started"
		}
		return dec.deny(ErrNotRunning, fmt.Sprintf("sandbox %s is %s", sb.ID, state))
	}
	return dec
}

func (dec decision) deny(err error, reason string) decision {
	dec.err, dec.reason = err, reason
	return dec
}

// admit applies the sandbox's access mode for the port (OSEP-0011 order): a token header
// that is present decides on its own (a wrong token is 401, no fallback to the signature);
// otherwise a signed route must verify.
func (d *decider) admit(dec *decision, h http.Header, now time.Time) (error, string) {
	c := dec.cand
	switch dec.mode {
	case watch.Public:
		dec.access = "public"
		return nil, ""
	case watch.Token, watch.Signed:
	default:
		return ErrForbidden, "the sandbox's access mode is not understood by this gateway"
	}
	tok, tokPresent := accessToken(h)
	if tokPresent {
		if !tokenMatches(tok, dec.sb.Access.TokenSHA256) {
			return ErrUnauthorized, "access token does not match"
		}
		if dec.mode == watch.Signed {
			return ErrForbidden, fmt.Sprintf("port %d of this sandbox accepts only signed URLs", c.Port)
		}
		dec.access = "token"
		return nil, ""
	}
	if !c.Signed {
		if dec.mode == watch.Signed {
			return ErrUnauthorized, "a signed URL is required"
		}
		return ErrUnauthorized, "an access token (X-Airlock-Access-Token or OpenSandbox-Secure-Access) or a signed URL is required"
	}
	if err := d.keys.Verify(c.ID, c.Port, c.ExpiresB36, c.Tag, now); err != nil {
		switch {
		case errors.Is(err, signedurl.ErrExpired):
			return ErrUnauthorized, "the signed URL has expired"
		case errors.Is(err, signedurl.ErrMalformed):
			return ErrBadRoute, "malformed signed URL"
		default:
			return ErrUnauthorized, "the signed URL is not valid"
		}
	}
	dec.access = "signed"
	return nil, ""
}

// accessToken returns the request's access token and whether either header is present
// (an empty value counts as present).
func accessToken(h http.Header) (string, bool) {
	if v, ok := h[HeaderAccessToken]; ok {
		return first(v), true
	}
	if v, ok := h[HeaderSecureAccess]; ok {
		return first(v), true
	}
	return "", false
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// tokenMatches compares SHA-256(tok) with the hex digest wantHex in constant time. An
// empty or malformed digest matches nothing.
func tokenMatches(tok, wantHex string) bool {
	want, err := hex.DecodeString(wantHex)
	if err != nil || len(want) != sha256.Size {
		return false
	}
	got := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(got[:], want) == 1
}
