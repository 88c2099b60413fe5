package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
)

// CookieName is the session cookie (HttpOnly, SameSite=Strict, Path=/console, Secure
// over TLS). Its value is a random id; the session lives in the server's memory only,
// so a restart of airlock up signs everyone out.
const CookieName = "airlock_console"

// maxSessions bounds the session table; the oldest session goes when it is full.
const maxSessions = 10000

// session is one signed-in browser.
type session struct {
	key     [32]byte // SHA-256 of the cookie value (the table never holds the id itself)
	csrf    string
	expires time.Time
	// apiKey is the key the operator signed in with (server memory only, never sent to
	// the browser): every API call of the session carries it, so the session can do
	// exactly what the key's role allows, and stops when the key is revoked or rotated.
	apiKey string
	// who is the key's principal, as of the session's last request.
	mu  sync.Mutex
	who principal.Principal
}

// principal returns the session's principal.
func (s *session) principal() principal.Principal {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.who
}

// sessionState says why a request has no session.
type sessionState int

const (
	sessionValid   sessionState = iota
	sessionNone                 // no cookie
	sessionExpired              // a cookie naming an expired or unknown session
)

// sessions is the in-memory session table.
type sessions struct {
	ttl time.Duration
	now func() time.Time
	mu  sync.Mutex
	m   map[[32]byte]*session
}

func newSessions(ttl time.Duration, now func() time.Time) *sessions {
	return &sessions{ttl: ttl, now: now, m: map[[32]byte]*session{}}
}

// randomToken is 32 random bytes, base64url.
func randomToken() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("console: no randomness: " + err.Error()) // crypto/rand does not fail on Linux
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// create opens a session for the principal who signed in with apiKey and returns its
// cookie value.
func (s *sessions) create(apiKey string, who principal.Principal) (id string, sess *session) {
	id = randomToken()
	sess = &session{key: sha256.Sum256([]byte(id)), csrf: randomToken(), expires: s.now().Add(s.ttl), apiKey: apiKey, who: who}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for k, v := range s.m {
		if !now.Before(v.expires) {
			delete(s.m, k)
		}
	}
	if len(s.m) >= maxSessions {
		var oldest [32]byte
		var at time.Time
		for k, v := range s.m {
			if at.IsZero() || v.expires.Before(at) {
				oldest, at = k, v.expires
			}
		}
		delete(s.m, oldest)
	}
	s.m[sess.key] = sess
	return id, sess
}

// lookup returns the live session of id.
func (s *sessions) lookup(id string) (*session, sessionState) {
	if id == "" {
		return nil, sessionNone
	}
	k := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.m[k]
	if !ok {
		return nil, sessionExpired
	}
	if !s.now().Before(sess.expires) {
		delete(s.m, k)
		return nil, sessionExpired
	}
	return sess, sessionValid
}

// remove ends the session of id.
func (s *sessions) remove(id string) {
	k := sha256.Sum256([]byte(id))
	s.mu.Lock()
	delete(s.m, k)
	s.mu.Unlock()
}

// fromRequest returns the request's session.
func (s *sessions) fromRequest(r *http.Request) (*session, sessionState) {
	ck, err := r.Cookie(CookieName)
	if err != nil {
		return nil, sessionNone
	}
	return s.lookup(ck.Value)
}

// setCookie sets (maxAge 0: until the browser closes; < 0: clears) the session cookie.
func setCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: CookieName, Value: value, Path: "/console", MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
}

type ctxKey struct{}

func sessionOf(r *http.Request) *session {
	s, _ := r.Context().Value(ctxKey{}).(*session)
	return s
}

// read admits console API requests that carry a live session whose key still
// authenticates (401 SESSION_EXPIRED or UNAUTHORIZED otherwise; a session whose key was
// revoked or rotated ends).
func (c *Console) read(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, state := c.liveSession(r)
		if s == nil {
			if state == sessionExpired {
				writeError(w, http.StatusUnauthorized, "SESSION_EXPIRED", "your console session has expired: sign in again")
			} else {
				writeError(w, http.StatusUnauthorized, "UNAUTHORIZED", "sign in to the console first")
			}
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, s)))
	})
}

// CSRFHeader carries the session's CSRF token on every write.
const CSRFHeader = "X-CSRF-Token"

// write admits a state-changing request: a live session, a same-origin request
// (originCheck) and the session's CSRF token in CSRFHeader (constant-time compare).
// Failures are 403 with code CSRF_FAILED, before anything is done.
func (c *Console) write(h http.HandlerFunc) http.Handler {
	return c.read(func(w http.ResponseWriter, r *http.Request) {
		if err := c.origins.check(r); err != nil {
			c.log.Warn("console write refused", "reason", err.Error(), "method", r.Method, "path", r.URL.Path, "client", r.RemoteAddr)
			writeError(w, http.StatusForbidden, "CSRF_FAILED", err.Error())
			return
		}
		if !tokenEqual(r.Header.Get(CSRFHeader), sessionOf(r).csrf) {
			c.log.Warn("console write refused", "reason", "csrf token", "method", r.Method, "path", r.URL.Path, "client", r.RemoteAddr)
			writeError(w, http.StatusForbidden, "CSRF_FAILED", "missing or wrong CSRF token: reload the page")
			return
		}
		h(w, r)
	})
}

// tokenEqual compares secrets in constant time; an empty token never matches.
func tokenEqual(got, want string) bool {
	if got == "" || want == "" {
		return false
	}
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// Sign-in limits, per minute: failed sign-ins per client (see loginClient) and for the
// whole console. The ceiling keeps many clients together from guessing fast; it is well
// above one client's share, so one client alone never locks the operators out.
const (
	loginPerClient = 10
	loginCeiling   = 200
)

// loginLimiter slows key guessing. Each client gets loginPerClient failed sign-ins per
// minute and the console loginCeiling; past either, attempts are 429 until that minute
// (a fixed window from the first failure) passes. An attempt takes its slot before the
// key is checked, under one lock with the check (take), and an attempt that turns out
// not to be a wrong key gives its slot back (refund): concurrent wrong guesses never
// exceed the limits. The table holds only clients with failures in a minute not yet
// over, so it never holds more than 2 × loginCeiling entries.
type loginLimiter struct {
	now     func() time.Time
	mu      sync.Mutex
	global  loginWindow
	clients map[netip.Prefix]loginWindow
}

// loginWindow counts the failures of one minute that began at start.
type loginWindow struct {
	start time.Time
	n     int
}

// loginSlot is a taken attempt: whose, and in which windows.
type loginSlot struct {
	client             netip.Prefix
	globalAt, clientAt time.Time
}

func newLoginLimiter(now func() time.Time) *loginLimiter {
	return &loginLimiter{now: now, clients: map[netip.Prefix]loginWindow{}}
}

// loginClient is the client a request counts against: the connection's remote address
// (X-Forwarded-For is not trusted: the console has no trusted-proxy setting, so behind
// a proxy every client is the proxy), an IPv6 address by its /64 (one host commonly
// holds a whole /64). An unreadable address counts as one shared client.
func loginClient(remoteAddr string) netip.Prefix {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return netip.Prefix{}
	}
	a := ap.Addr().Unmap().WithZone("")
	if a.Is4() {
		return netip.PrefixFrom(a, 32)
	}
	p, _ := a.Prefix(64)
	return p
}

// take reserves one attempt for client: false (and nothing taken) when the client or
// the console is at its limit this minute.
func (l *loginLimiter) take(client netip.Prefix) (loginSlot, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if now.Sub(l.global.start) >= time.Minute {
		l.global = loginWindow{start: now}
		for k, w := range l.clients {
			if now.Sub(w.start) >= time.Minute {
				delete(l.clients, k)
			}
		}
	}
	w, ok := l.clients[client]
	if !ok || now.Sub(w.start) >= time.Minute {
		w = loginWindow{start: now}
	}
	if w.n >= loginPerClient || l.global.n >= loginCeiling {
		return loginSlot{}, false
	}
	w.n++
	l.global.n++
	l.clients[client] = w
	return loginSlot{client: client, globalAt: l.global.start, clientAt: w.start}, true
}

// refund gives back a slot whose attempt was not a wrong key (a sign-in that succeeded,
// a form that could not be read). A slot of a minute that has passed is already void.
func (l *loginLimiter) refund(s loginSlot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.global.start.Equal(s.globalAt) && l.global.n > 0 {
		l.global.n--
	}
	if w, ok := l.clients[s.client]; ok && w.start.Equal(s.clientAt) {
		if w.n--; w.n <= 0 {
			delete(l.clients, s.client)
		} else {
			l.clients[s.client] = w
		}
	}
}

func (c *Console) handleLoginPage(w http.ResponseWriter, r *http.Request) {
	if s, _ := c.sessions.fromRequest(r); s != nil {
		http.Redirect(w, r, safeNext(r.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	d := pageData{Title: "Sign in", NoAuth: c.cfg.APIKey == ""}
	if r.URL.Query().Get("expired") != "" {
		d.Notice = "Your session has expired. Sign in again."
	}
	if r.URL.Query().Get("out") != "" {
		d.Notice = "You are signed out."
	}
	c.render(w, http.StatusOK, "login.html", d)
}

// handleLogin checks the API key from the form (field "key") and opens a session; a
// wrong key is 401 with the login page saying so. The request must be same-origin (a
// forged login would sign the victim into the attacker's session).
func (c *Console) handleLogin(w http.ResponseWriter, r *http.Request) {
	d := pageData{Title: "Sign in", NoAuth: c.cfg.APIKey == ""}
	if err := c.origins.check(r); err != nil {
		d.Error = "Sign-in refused: " + err.Error() + "."
		c.signInRecord(r, opSignIn, principal.Principal{}, http.StatusForbidden, "sign-in refused: "+err.Error())
		c.render(w, http.StatusForbidden, "login.html", d)
		return
	}
	slot, ok := c.logins.take(loginClient(r.RemoteAddr))
	if !ok {
		c.log.Warn("console sign-in refused", "reason", "too many failures", "client", r.RemoteAddr)
		c.signInRecord(r, opSignIn, principal.Principal{}, http.StatusTooManyRequests, "sign-in refused: too many failed sign-ins")
		d.Error = "Too many failed sign-ins: wait a minute and try again."
		c.render(w, http.StatusTooManyRequests, "login.html", d)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		c.logins.refund(slot)
		d.Error = "The sign-in form could not be read."
		c.render(w, http.StatusBadRequest, "login.html", d)
		return
	}
	key := r.PostForm.Get("key")
	who, ok := c.authenticate(key)
	if !ok {
		c.log.Warn("console sign-in failed", "client", r.RemoteAddr)
		c.signInRecord(r, opSignIn, principal.Principal{}, http.StatusUnauthorized, "sign-in failed: wrong API key")
		d.Error = "Wrong API key."
		c.render(w, http.StatusUnauthorized, "login.html", d)
		return
	}
	c.logins.refund(slot)
	if old, err := r.Cookie(CookieName); err == nil {
		c.sessions.remove(old.Value) // never keep a session id from before sign-in
	}
	id, _ := c.sessions.create(key, who)
	// A browser-session cookie: the server's table decides expiry, and a browser that
	// still sends the cookie afterwards is told that its session expired.
	setCookie(w, r, id, 0)
	c.log.Info("console sign-in", "client", r.RemoteAddr, "principal_id", who.ID, "role", string(who.Role))
	c.signInRecord(r, opSignIn, who, http.StatusSeeOther, "")
	http.Redirect(w, r, safeNext(r.PostForm.Get("next")), http.StatusSeeOther)
}

func (c *Console) handleLogout(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(CookieName); err == nil {
		if s, _ := c.sessions.fromRequest(r); s != nil {
			s.mu.Lock()
			who := s.who
			s.mu.Unlock()
			c.signInRecord(r, opSignOut, who, http.StatusNoContent, "")
		}
		c.sessions.remove(ck.Value)
	}
	setCookie(w, r, "", -1)
	c.log.Info("console sign-out", "client", r.RemoteAddr)
	w.WriteHeader(http.StatusNoContent)
}

// handleSession answers GET /console/api/session: {"noAuth","expiresAt","principal":
// {"id","name","role"}}.
func (c *Console) handleSession(w http.ResponseWriter, r *http.Request) {
	s := sessionOf(r)
	opensandbox.WriteJSON(w, http.StatusOK, map[string]any{"noAuth": c.cfg.APIKey == "", "expiresAt": s.expires.UTC(), "principal": s.principal()})
}

// authenticate returns the principal of key: Config.Authenticate's answer; without it,
// the admin principal for Config.APIKey; with no authentication (no APIKey), the
// anonymous admin for a key nobody has.
func (c *Console) authenticate(key string) (principal.Principal, bool) {
	if c.cfg.Authenticate != nil {
		if p, ok := c.cfg.Authenticate(key); ok {
			return p, true
		}
	} else if c.cfg.APIKey != "" && tokenEqual(key, c.cfg.APIKey) {
		return principal.Principal{ID: principal.ConfiguredAdminID, Name: "admin (configured key)", Role: principal.Admin}, true
	}
	if c.cfg.APIKey == "" {
		return principal.Principal{ID: principal.AnonymousID, Name: "anonymous (no authentication)", Role: principal.Admin}, true
	}
	return principal.Principal{}, false
}

// liveSession returns the request's session when it is live and its key still
// authenticates; a session whose key was revoked or rotated is removed (its state is
// then sessionExpired).
func (c *Console) liveSession(r *http.Request) (*session, sessionState) {
	s, state := c.sessions.fromRequest(r)
	if s != nil && !c.refresh(s) {
		if ck, err := r.Cookie(CookieName); err == nil {
			c.sessions.remove(ck.Value)
		}
		c.log.Info("console session ended: its key no longer authenticates", "principal_id", s.principal().ID)
		return nil, sessionExpired
	}
	return s, state
}

// refresh re-authenticates s's key (in memory, no I/O) and updates its principal;
// false when the key no longer authenticates.
func (c *Console) refresh(s *session) bool {
	who, ok := c.authenticate(s.apiKey)
	if ok {
		s.mu.Lock()
		s.who = who
		s.mu.Unlock()
	}
	return ok
}

// allow admits requests of sessions whose role may perform act (403 FORBIDDEN
// otherwise), for the console's own routes that read the audit log from disk.
func (c *Console) allow(act principal.Action, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if who := sessionOf(r).principal(); !who.Role.Allows(act) {
			writeError(w, http.StatusForbidden, "FORBIDDEN", "the "+string(who.Role)+" role of "+who.ID+" may not "+act.String())
			return
		}
		h(w, r)
	}
}

// safeNext keeps a post-login redirect inside the console.
func safeNext(next string) string {
	u, err := url.Parse(next)
	if next == "" || err != nil || u.IsAbs() || u.Host != "" || len(u.Path) < len(Prefix) ||
		u.Path[:len(Prefix)] != Prefix || u.Path == Prefix+"login" {
		return Prefix
	}
	return u.Path
}

func urlQueryEscape(s string) string { return url.QueryEscape(s) }
