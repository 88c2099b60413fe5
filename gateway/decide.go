package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/airlockdev/airlock/gateway/accesstoken"
	"github.com/airlockdev/airlock/gateway/route"
	"github.com/airlockdev/airlock/gateway/routetable"
	"github.com/airlockdev/airlock/gateway/signedurl"
	"github.com/airlockdev/airlock/internal/execdtoken"
	"github.com/airlockdev/airlock/lifecycle/watch"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
)

// strippedHeaders never reach a sandbox: they carry routing and credentials for the
// gateway only (the sandbox's token, under the Airlock name or the OpenSandbox one,
// OSEP-0011, and lifecycle's API key).
var strippedHeaders = []string{opensandbox.HeaderIngressTo, opensandbox.HeaderSandbox, opensandbox.HeaderPort,
	opensandbox.HeaderAccessToken, opensandbox.HeaderSecureAccess, opensandbox.HeaderAPIKey}

// decision is the outcome of routing and admitting one request. A deny is a value: err is
// one of the sentinel errors and reason the message for the client.
type decision struct {
	cand   route.Candidate
	entry  *routetable.Entry
	sb     *watch.Sandbox
	token  *accesstoken.Digest // SHA-256 of the sandbox's access token, nil when none
	mode   watch.AccessMode
	dial   string // upstream host:port
	access string // how the request was admitted: public, token, signed, api_key, principal_key
	// caller is the principal of another API key the request carries (looked up before
	// decide, which performs no I/O); nil when none was looked up.
	caller *keyCaller

	err        error
	reason     string
	retryAfter int
}

// decider routes and admits requests against a route table. decide performs no I/O.
type decider struct {
	table  *routetable.Table
	keys   *signedurl.Keyring  // nil: no signed routes verify
	apiKey *accesstoken.Digest // SHA-256 of lifecycle's API key; nil: the key admits nothing
	// execdKey derives execd tokens (App.ExecdKey); empty: they admit nothing.
	execdKey execdtoken.Key
	domains  []string
	// synced reports whether the table holds a complete snapshot; before that an unknown
	// sandbox is "not loaded yet" (503), not "not found". nil means always synced.
	synced func() bool
}

// keyCaller is the lookup of an API key other than the configured one
// (principalKeys.lookup): its principal, whether lifecycle knows it, or why it could not
// be checked.
type keyCaller struct {
	p     principal.Principal
	known bool
	err   error
}

// decide routes r and admits it; caller is the principal of r's API key when it is not
// the configured one (nil: none looked up).
func (d *decider) decide(r *http.Request, now time.Time, caller *keyCaller) decision {
	var buf [route.MaxCandidates]route.Candidate
	_, hasSandbox := r.Header[opensandbox.HeaderSandbox]
	_, hasPort := r.Header[opensandbox.HeaderPort]
	in := route.Input{
		Host:       r.Host,
		Path:       r.URL.EscapedPath(),
		IngressTo:  r.Header.Get(opensandbox.HeaderIngressTo),
		Sandbox:    r.Header.Get(opensandbox.HeaderSandbox),
		Port:       r.Header.Get(opensandbox.HeaderPort),
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
		sb, tok := e.View()
		mode := sb.Access.ModeFor(c.Port)
		// Control ports are never public, whatever the sandbox's access settings say
		// (docs/architecture.md#control-surfaces-are-never-public): a public mode on them
		// counts as token.
		if mode == watch.Public && opensandbox.IsControlPort(c.Port) {
			mode = watch.Token
		}
		// OSEP-0011: on a public port, signed-looking path segments are the app's own path.
		if c.Signed && c.Form == route.FormPath && mode == watch.Public {
			continue
		}
		dec = decision{cand: c, entry: e, sb: sb, token: tok, mode: mode}
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
	case string(opensandbox.Stopping), string(opensandbox.Terminated), string(opensandbox.Failed):
		return dec.deny(ErrGone, fmt.Sprintf("sandbox %s is %s", sb.ID, sb.State))
	}
	if sb.ExpiresAt != nil && now.After(*sb.ExpiresAt) {
		return dec.deny(ErrGone, fmt.Sprintf("sandbox %s expired at %s", sb.ID, sb.ExpiresAt.UTC().Format(time.RFC3339)))
	}
	dec.caller = caller
	if err, reason := d.admit(&dec, r.Header, now); err != nil {
		return dec.deny(err, reason)
	}
	dec.dial = dec.entry.Dial(dec.cand.Port)
	if sb.State == string(opensandbox.Paused) || sb.State == string(opensandbox.Pausing) {
		// Not retried, and no renew intent: a paused sandbox is resumed only by its
		// owner through the lifecycle API.
		return dec.deny(ErrPaused, fmt.Sprintf("sandbox %s is %s: resume it through the lifecycle API (POST /sandboxes/%s/resume)", sb.ID, sb.State, sb.ID))
	}
	if sb.State != string(opensandbox.Running) || dec.dial == "" {
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

// admit applies the sandbox's access mode for the port. On a token port the API key
// admits when it matches; otherwise (OSEP-0011 order) a token header that is present
// decides on its own (a wrong token is 401, no fallback to the signature), else a signed
// route must verify. A signed-only port takes neither the API key nor a token.
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
	key, keyPresent := accesstoken.APIKey(h)
	if keyPresent && dec.mode == watch.Token && d.apiKey.Matches(key) {
		dec.access = "api_key"
		return nil, ""
	}
	if keyPresent && dec.mode == watch.Token && dec.caller != nil {
		if err, reason := admitPrincipal(dec); err != nil || dec.access != "" {
			return err, reason
		}
	}
	tok, tokPresent := accesstoken.Token(h)
	if tokPresent {
		if !dec.token.Matches(tok) {
			return ErrUnauthorized, "access token does not match"
		}
		if dec.mode == watch.Signed {
			return ErrForbidden, fmt.Sprintf("port %d of this sandbox accepts only signed URLs", c.Port)
		}
		dec.access = "token"
		return nil, ""
	}
	// On execd's port, the sandbox's execd token as its endpoint lists it (the header
	// OpenSandbox's execd clients send) decides on its own too.
	if et, ok := h[opensandbox.HeaderExecdAccessToken]; ok && c.Port == opensandbox.ExecdPort && len(d.execdKey) > 0 {
		if len(et) == 0 || !d.execdKey.Matches(dec.sb.ID, et[0]) {
			return ErrUnauthorized, "the execd token does not match"
		}
		dec.access = "execd_token"
		return nil, ""
	}
	if !c.Signed {
		switch {
		case dec.mode == watch.Signed:
			return ErrUnauthorized, "a signed URL is required"
		case keyPresent:
			return ErrUnauthorized, "the API key is not admitted here (it does not match, or this gateway refuses it); send the sandbox's access token or a signed URL"
		}
		return ErrUnauthorized, fmt.Sprintf("port %d needs a credential: the sandbox's access token (X-Airlock-Access-Token or OpenSandbox-Secure-Access; X-EXECD-ACCESS-TOKEN on port 44772, as GET /sandboxes/{id}/endpoints/{port} gives in headers), a signed URL or the API key", c.Port)
	}
	// The tag covers the sandbox's signed-URL epoch: lifecycle revokes every signed URL of
	// the sandbox by bumping it (POST /sandboxes/{id}/signed-urls/revoke).
	if err := d.keys.VerifyEpoch(c.ID, c.Port, c.ExpiresB36, c.Tag, dec.sb.Access.SignedEpoch, now); err != nil {
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

// admitPrincipal decides a token port for another API key's principal (lifecycle's
// roles, package principal): admin and operator keys use every sandbox, a user key the
// sandboxes it created (another's is "not found", as lifecycle answers it), an auditor
// key none. A key lifecycle does not know falls through to the other credentials (nil
// error, access unset); one that could not be checked is refused for now.
func admitPrincipal(dec *decision) (error, string) {
	c := dec.caller
	switch {
	case c.err != nil:
		dec.retryAfter = 1
		return ErrNotReady, "the API key could not be checked with lifecycle; retry"
	case !c.known:
		return nil, ""
	case !c.p.Role.Allows(principal.UseSandbox):
		return ErrForbidden, fmt.Sprintf("an API key with role %s may not use sandboxes", c.p.Role)
	case !c.p.Role.OwnsAll() && dec.sb.Owner != c.p.ID:
		return ErrNotFound, fmt.Sprintf("sandbox %s not found", dec.sb.ID)
	}
	dec.access = "principal_key"
	return nil, ""
}
