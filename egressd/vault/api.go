package vault

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/airlockdev/airlock/opensandbox"
)

// apiError is an API failure: status, the project's error code, a message without
// secret values.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func fail(status int, code, format string, a ...any) error {
	return &apiError{status, code, fmt.Sprintf(format, a...)}
}

func badRequest(format string, a ...any) error {
	return fail(http.StatusBadRequest, "INVALID_REQUEST", format, a...)
}

// maxBody bounds a request body.
const maxBody = 1 << 20

// ServeAPI answers the Credential Vault routes of one sandbox's egress API
// (egress-api.yaml): rest is "/credential-vault", "/credential-vault/credentials[/{name}]"
// or "/credential-vault/bindings[/{name}]". POST creates (201; 409 when one exists), GET
// reads the sanitized state (404 without a vault), PATCH applies a mutation atomically
// (409 on a stale expectedRevision or an added name that exists; 404 for a replaced or
// deleted name that does not), DELETE removes it (204). cover is asked for every host
// and port of a binding being created or replaced; its error rejects the request with
// 412. Errors are {"code","message"} JSON; nothing changes on any error.
func (s *Store) ServeAPI(w http.ResponseWriter, r *http.Request, sandboxID, rest string, cover func(host string, port uint16) error) {
	status, body, err := s.serve(r, sandboxID, rest, cover)
	if err != nil {
		var ae *apiError
		if !errors.As(err, &ae) {
			s.log.Error("credential vault request failed", "sandbox_id", sandboxID, "err", err)
			ae = &apiError{http.StatusInternalServerError, "INTERNAL_ERROR", "internal error; see the server log"}
		}
		opensandbox.WriteError(w, ae.status, opensandbox.ErrorBody{Code: ae.code, Message: ae.msg})
		return
	}
	if status == http.StatusNoContent {
		w.WriteHeader(status)
		return
	}
	opensandbox.WriteJSON(w, status, body)
}

func (s *Store) serve(r *http.Request, id, rest string, cover func(string, uint16) error) (int, any, error) {
	sub, name, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(rest, "/credential-vault"), "/"), "/")
	if sub == "" {
		switch r.Method {
		case http.MethodGet:
			st, err := s.state(id)
			return http.StatusOK, st, err
		case http.MethodPost:
			var req CreateRequest
			if err := decode(r, &req); err != nil {
				return 0, nil, err
			}
			st, err := s.change(id, "create", func(cur *vault) (*vault, error) {
				if cur != nil {
					return nil, fail(http.StatusConflict, "CONFLICT", "the sandbox already has a Credential Vault: PATCH or DELETE it")
				}
				return build(&vault{}, 1, req.Credentials, nil, nil, req.Bindings, nil, nil, cover)
			})
			return http.StatusCreated, st, err
		case http.MethodPatch:
			var req MutationRequest
			if err := decode(r, &req); err != nil {
				return 0, nil, err
			}
			st, err := s.change(id, "patch", func(cur *vault) (*vault, error) {
				if cur == nil {
					return nil, fail(http.StatusNotFound, "NOT_FOUND", "the sandbox has no Credential Vault")
				}
				if req.ExpectedRevision != nil && *req.ExpectedRevision != cur.Revision {
					return nil, fail(http.StatusConflict, "CONFLICT", "expectedRevision %d is not the current revision %d", *req.ExpectedRevision, cur.Revision)
				}
				c, b := req.Credentials, req.Bindings
				return build(cur, cur.Revision+1, c.Add, c.Replace, c.Delete, b.Add, b.Replace, b.Delete, cover)
			})
			return http.StatusOK, st, err
		case http.MethodDelete:
			_, err := s.change(id, "delete", func(cur *vault) (*vault, error) {
				if cur == nil {
					return nil, fail(http.StatusNotFound, "NOT_FOUND", "the sandbox has no Credential Vault")
				}
				return nil, nil
			})
			return http.StatusNoContent, nil, err
		}
		return 0, nil, fail(http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "%s /credential-vault: use GET, POST, PATCH or DELETE", r.Method)
	}
	if r.Method != http.MethodGet {
		return 0, nil, fail(http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "%s %s: use GET", r.Method, rest)
	}
	st, err := s.state(id)
	if err != nil {
		return 0, nil, err
	}
	switch {
	case sub == "credentials" && name == "":
		return http.StatusOK, map[string]any{"revision": st.Revision, "credentials": st.Credentials}, nil
	case sub == "bindings" && name == "":
		return http.StatusOK, map[string]any{"revision": st.Revision, "bindings": st.Bindings}, nil
	case sub == "credentials":
		if i := slices.IndexFunc(st.Credentials, func(c CredentialMeta) bool { return c.Name == name }); i >= 0 {
			return http.StatusOK, st.Credentials[i], nil
		}
		return 0, nil, fail(http.StatusNotFound, "NOT_FOUND", "no credential %q", name)
	case sub == "bindings":
		if i := slices.IndexFunc(st.Bindings, func(b BindingMetadata) bool { return b.Name == name }); i >= 0 {
			return http.StatusOK, st.Bindings[i], nil
		}
		return 0, nil, fail(http.StatusNotFound, "NOT_FOUND", "no binding %q", name)
	}
	return 0, nil, fail(http.StatusNotFound, "NOT_FOUND", "no route %s", rest)
}

func decode(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return badRequest("reading the body: %v", err)
	}
	if len(b) > maxBody {
		return fail(http.StatusRequestEntityTooLarge, "INVALID_REQUEST", "body over %d bytes", maxBody)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		// json's messages quote field names and types, never string values.
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return fail(http.StatusBadRequest, "INVALID_JSON", "malformed JSON at byte %d", se.Offset)
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fail(http.StatusBadRequest, "INVALID_JSON", "field %s: want %s", te.Field, te.Type)
		}
		return fail(http.StatusBadRequest, "INVALID_JSON", "%s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}

// state is the sanitized vault of id, or 404.
func (s *Store) state(id string) (State, error) {
	e := s.get(id)
	if e == nil || e.data.Vault == nil {
		return State{}, fail(http.StatusNotFound, "NOT_FOUND", "the sandbox has no Credential Vault")
	}
	v := e.data.Vault
	st := State{Revision: v.Revision, Credentials: []CredentialMeta{}, Bindings: []BindingMetadata{}}
	for _, c := range v.Credentials {
		st.Credentials = append(st.Credentials, CredentialMeta{Name: c.Name, SourceType: "inline", Revision: c.Revision})
	}
	for _, b := range v.Bindings {
		st.Bindings = append(st.Bindings, BindingMetadata{Name: b.Binding.Name, Revision: b.Revision,
			Match: b.Binding.Match, Auth: AuthMetadata{Type: b.Binding.Auth.Type, Name: b.Binding.Auth.Name}})
	}
	return st, nil
}

// change applies fn to the sandbox's vault (nil: none) under the write lock: the
// result (nil: deleted) is sealed to disk, then published, then reported.
func (s *Store) change(id, op string, fn func(cur *vault) (*vault, error)) (State, error) {
	s.mu.Lock()
	e := s.get(id)
	if e == nil {
		s.mu.Unlock()
		return State{}, fail(http.StatusPreconditionFailed, "PRECONDITION_FAILED", "the credential proxy of sandbox %s is not set up (no interception CA)", id)
	}
	next, err := fn(e.data.Vault)
	if err != nil {
		s.mu.Unlock()
		return State{}, err
	}
	d := e.data
	d.Vault = next
	ne, err := newEntry(d)
	if err == nil {
		err = s.persist(id, d)
	}
	if err != nil {
		s.mu.Unlock()
		return State{}, err
	}
	s.publish(id, ne)
	s.mu.Unlock()

	ch := Change{SandboxID: id, Op: op}
	if next != nil {
		ch.Revision = next.Revision
		for _, c := range next.Credentials {
			ch.Credentials = append(ch.Credentials, c.Name)
		}
		for _, b := range next.Bindings {
			ch.Bindings = append(ch.Bindings, b.Binding.Name)
		}
	}
	if fn := s.onChange.Load(); fn != nil {
		(*fn)(ch)
	}
	if next == nil {
		return State{}, nil
	}
	return s.state(id)
}

// build returns a copy of cur at revision rev with the credential and binding
// mutations applied, checked as a whole: unique valid names, every referenced
// credential present, every binding's hosts and ports covered.
func build(cur *vault, rev int64, cAdd, cRepl []Credential, cDel []string, bAdd, bRepl []Binding, bDel []string, cover func(string, uint16) error) (*vault, error) {
	next := &vault{Revision: rev, Credentials: slices.Clone(cur.Credentials), Bindings: slices.Clone(cur.Bindings)}
	credIdx := func(n string) int {
		return slices.IndexFunc(next.Credentials, func(c storedCred) bool { return c.Name == n })
	}
	bindIdx := func(n string) int {
		return slices.IndexFunc(next.Bindings, func(b storedBind) bool { return b.Binding.Name == n })
	}

	for _, n := range cDel {
		i := credIdx(n)
		if i < 0 {
			return nil, fail(http.StatusNotFound, "NOT_FOUND", "credentials.delete: no credential %q", n)
		}
		next.Credentials = slices.Delete(next.Credentials, i, i+1)
	}
	for i, c := range append(slices.Clone(cAdd), cRepl...) {
		replace := i >= len(cAdd)
		if !nameRE.MatchString(c.Name) {
			return nil, badRequest("credential name %q: want 1 to 128 of A-Z a-z 0-9 . _ -", c.Name)
		}
		if c.Source.Type != "inline" || c.Source.Value == "" {
			return nil, badRequest("credential %q: source must be {\"type\":\"inline\",\"value\":...} with a value", c.Name)
		}
		j := credIdx(c.Name)
		switch {
		case replace && j < 0:
			return nil, fail(http.StatusNotFound, "NOT_FOUND", "credentials.replace: no credential %q", c.Name)
		case !replace && j >= 0:
			return nil, fail(http.StatusConflict, "CONFLICT", "credential %q exists: use replace", c.Name)
		case replace:
			next.Credentials[j] = storedCred{Name: c.Name, Value: c.Source.Value, Revision: rev}
		default:
			next.Credentials = append(next.Credentials, storedCred{Name: c.Name, Value: c.Source.Value, Revision: rev})
		}
	}
	for _, n := range bDel {
		i := bindIdx(n)
		if i < 0 {
			return nil, fail(http.StatusNotFound, "NOT_FOUND", "bindings.delete: no binding %q", n)
		}
		next.Bindings = slices.Delete(next.Bindings, i, i+1)
	}
	for i, b := range append(slices.Clone(bAdd), bRepl...) {
		replace := i >= len(bAdd)
		if !nameRE.MatchString(b.Name) {
			return nil, badRequest("binding name %q: want 1 to 128 of A-Z a-z 0-9 . _ -", b.Name)
		}
		m, err := b.Match.normalize()
		if err != nil {
			return nil, badRequest("binding %q: %v", b.Name, err)
		}
		b.Match = m
		if _, err := b.Auth.credentialsOf(); err != nil {
			return nil, badRequest("binding %q: %v", b.Name, err)
		}
		for _, h := range m.Hosts {
			for _, p := range m.Ports {
				if err := cover(h, uint16(p)); err != nil {
					return nil, fail(http.StatusPreconditionFailed, "PRECONDITION_FAILED", "binding %q: %v", b.Name, err)
				}
			}
		}
		j := bindIdx(b.Name)
		switch {
		case replace && j < 0:
			return nil, fail(http.StatusNotFound, "NOT_FOUND", "bindings.replace: no binding %q", b.Name)
		case !replace && j >= 0:
			return nil, fail(http.StatusConflict, "CONFLICT", "binding %q exists: use replace", b.Name)
		case replace:
			next.Bindings[j] = storedBind{Binding: b, Revision: rev}
		default:
			next.Bindings = append(next.Bindings, storedBind{Binding: b, Revision: rev})
		}
	}
	for _, b := range next.Bindings {
		refs, _ := b.Binding.Auth.credentialsOf()
		for _, r := range refs {
			if credIdx(r) < 0 {
				return nil, badRequest("binding %q refers to credential %q, which does not exist", b.Binding.Name, r)
			}
		}
	}
	return next, nil
}
