package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/principal"
)

// PolicyResponse is the answer of Airlock's own policy API
// (GET/PUT/PATCH/DELETE /v1/sandboxes/{id}/policy).
type PolicyResponse struct {
	SandboxID string `json:"sandboxId"`
	// Name is the library policy the sandbox runs under (Policy is then that policy
	// with the sandbox's additions first); empty for a policy of its own.
	Name string `json:"name,omitempty"`
	// Pinned is set when the sandbox runs Name at the version a snapshot captured, not
	// the library's current one (a restored sandbox; policypin.go): PUT ?name=Name
	// unpins it, a PUT of a document gives it a policy of its own.
	Pinned *PinnedPolicy `json:"pinned,omitempty"`
	// Version increases with every change (the data plane applies versions in order).
	Version uint64 `json:"version"`
	// Policy is the stored document (Airlock JSON form); null when the sandbox has
	// none and the operator's default applies.
	Policy json.RawMessage `json:"policy"`
	// NetworkPolicy is the same policy in the OpenSandbox shape; Lossless is false when
	// it uses Airlock extensions (ports, protocols, DNS options, mode) that the
	// OpenSandbox shape cannot carry.
	NetworkPolicy *policies.NetworkPolicy `json:"networkPolicy,omitempty"`
	Lossless      bool                    `json:"lossless"`
}

// DefaultPolicy is what a sandbox without a policy gets from the data plane (egressd's
// default: allow, minus the operator overlay and special addresses, as OpenSandbox does
// without a networkPolicy). The egress API reports it, and PATCH/DELETE start from it.
var DefaultPolicy = json.RawMessage(`{"defaultAction":"allow","egress":[]}`)

// policyReader reads a sandbox's effective policy document and version (Server.Policy).
type policyReader interface {
	Policy(id string) (json.RawMessage, uint64, error)
}

// policyRecords is what the policy API needs of the sandbox registry (the Server).
// None of its methods performs I/O besides the store write of a change, except
// updateEgress, which calls the runtime.
type policyRecords interface {
	policyReader
	// peek runs fn on the sandbox's record under the registry lock (fn must neither
	// block nor call back) and reports whether the sandbox exists.
	peek(id string, fn func(rec *record)) bool
	// updatePolicy is Server.UpdatePolicy; replace detaches a sandbox from its named
	// policy.
	updatePolicy(id string, replace bool, fn func(cur json.RawMessage) (json.RawMessage, error)) (uint64, error)
	// SetNamedPolicy puts the sandbox under a library policy.
	SetNamedPolicy(id, name string) (uint64, error)
	// updateEgress hands the runtime's second network layer the sandbox's new policy.
	updateEgress(ctx context.Context, id string)
	// recordEvent appends a diagnostic event to the sandbox's ring and persists it.
	recordEvent(id, source, typ, reason, msg string)
}

// policyAPI serves Airlock's policy routes (GET/PUT/PATCH/DELETE
// /sandboxes/{id}/policy, PUT …?name= for a library policy) and the OpenSandbox egress
// API that the server proxy routes to sandbox port 18080 (/policy here,
// /credential-vault through vault). Every change attempt is audited (source policy)
// and answered once the data plane confirms it (gate), at most timeout.
type policyAPI struct {
	reg   policyRecords
	lib   *policyLibrary
	vault *vaultAPI
	// audit receives a record per change attempt; nil means none.
	audit interface{ Append(audit.Record) }
	// gate reports whether the data plane enforces a version of a sandbox's policy
	// (Config.PolicyGate); nil confirms at once.
	gate    func(id string, version uint64) bool
	timeout time.Duration
	log     *slog.Logger
}

func (a *policyAPI) routes(m *http.ServeMux) {
	m.HandleFunc("GET /sandboxes/{id}/policy", a.handleGet)
	m.HandleFunc("PUT /sandboxes/{id}/policy", a.handlePut)
	m.HandleFunc("PATCH /sandboxes/{id}/policy", a.handlePatch)
	m.HandleFunc("DELETE /sandboxes/{id}/policy", a.handleDelete)
}

// storedPolicy returns the sandbox's effective policy parsed (nil when it has none)
// and its version.
func storedPolicy(reg policyReader, id string) (*policies.Policy, uint64, error) {
	raw, v, err := reg.Policy(id)
	if err != nil {
		return nil, 0, err
	}
	if len(raw) == 0 || string(raw) == "null" {
		return nil, v, nil
	}
	p, err := policies.Parse(id, raw)
	if err != nil {
		return nil, 0, fmt.Errorf("stored policy of %s: %w", id, err)
	}
	return p, v, nil
}

// policyName is the library policy sandbox id runs under ("" for none, or an unknown
// sandbox) and its pin (nil when it follows the library).
func (a *policyAPI) policyName(id string) (string, *PinnedPolicy) {
	var name string
	var pin *PinnedPolicy
	a.reg.peek(id, func(rec *record) { name, pin = rec.PolicyName, a.lib.pinned(rec) })
	return name, pin
}

// namedBase is the named policy sandbox id runs under (its pinned document, else the
// library's current version) and its name; nil when it has none.
func (a *policyAPI) namedBase(id string) (*policies.Policy, string) {
	var base *policies.Policy
	var name string
	a.reg.peek(id, func(rec *record) {
		if rec.PolicyName != "" {
			name = rec.PolicyName
			base, _, _ = a.lib.base(rec)
		}
	})
	return base, name
}

// change applies fn to the sandbox's current policy (DefaultPolicy when it has none)
// atomically, persists the result (Airlock JSON form) and audits the attempt: action
// allow when applied, deny when the change was rejected. kind is put, patch or delete.
func (a *policyAPI) change(r *http.Request, id, kind string, fn func(cur *policies.Policy) (*policies.Policy, error)) error {
	// A put replaces the whole policy (a sandbox under a named policy leaves it); a
	// patch or delete changes the additions of a named sandbox.
	v, err := a.reg.updatePolicy(id, kind == "put", func(raw json.RawMessage) (json.RawMessage, error) {
		if len(raw) == 0 || string(raw) == "null" {
			raw = DefaultPolicy
		}
		cur, err := policies.Parse(id, raw)
		if err != nil {
			return nil, fmt.Errorf("stored policy of %s: %w", id, err)
		}
		p, err := fn(cur)
		if err != nil {
			return nil, err
		}
		return json.Marshal(p)
	})
	if errors.Is(err, ErrNotFound) {
		return err
	}
	if a.audit != nil {
		rec := audit.Record{
			Time: time.Now(), SandboxID: id, Source: audit.SourcePolicy, Src: r.RemoteAddr,
			Action: string(policies.Allow), Reason: "policy changed: " + kind, PolicyVersion: v,
			Extra: map[string]any{"change": kind, "route": r.Method + " " + r.URL.Path, "principal": principal.IDFromContext(r.Context())},
		}
		if err != nil {
			rec.Action, rec.Reason = string(policies.Deny), "policy change rejected: "+err.Error()
		}
		a.audit.Append(rec)
	}
	if err != nil {
		return err
	}
	a.log.Info("policy changed", "sandbox_id", id, "change", kind, "policy_version", v)
	a.await(r.Context(), id, v)
	return nil
}

// await hands the runtime's second layer the new egress (EgressUpdater), then waits
// until the gate confirms that version v of a Running sandbox's policy is enforced, at
// most timeout; a change that is not confirmed in time is logged (it stays stored and
// the data plane applies it late).
func (a *policyAPI) await(ctx context.Context, id string, v uint64) {
	a.reg.updateEgress(ctx, id)
	if a.gate == nil {
		return
	}
	running := false
	a.reg.peek(id, func(rec *record) { running = rec.Status.State == opensandbox.Running })
	if !running {
		return
	}
	start := time.Now()
	deadline := start.Add(a.timeout)
	for !a.gate(id, v) {
		if time.Now().After(deadline) {
			a.log.Warn("policy change not confirmed enforced in time", "sandbox_id", id, "policy_version", v,
				"timeout_ms", a.timeout.Milliseconds())
			a.reg.recordEvent(id, EventNetwork, EventWarning, "PolicyNotConfirmed",
				fmt.Sprintf("the data plane did not confirm policy version %d within %s; it stays stored and applies late", v, a.timeout))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
	a.reg.recordEvent(id, EventNetwork, EventNormal, "PolicyEnforced",
		fmt.Sprintf("the data plane confirms policy version %d enforced after %d ms", v, time.Since(start).Milliseconds()))
}

// write answers the sandbox's policy (PolicyResponse).
func (a *policyAPI) write(w http.ResponseWriter, r *http.Request, id string) {
	p, v, err := storedPolicy(a.reg, id)
	if err != nil {
		fail(a.log, w, r, err)
		return
	}
	resp := PolicyResponse{SandboxID: id, Version: v, Policy: json.RawMessage("null")}
	resp.Name, resp.Pinned = a.policyName(id)
	if p != nil {
		resp.Policy, _ = json.Marshal(p)
		np, lossless := policies.ToNetworkPolicy(p)
		resp.NetworkPolicy, resp.Lossless = &np, lossless
	}
	opensandbox.WriteJSON(w, http.StatusOK, resp)
}

func (a *policyAPI) handleGet(w http.ResponseWriter, r *http.Request) {
	a.write(w, r, r.PathValue("id"))
}

// handlePut replaces the policy with the body: an Airlock policy (YAML or JSON) or an
// OpenSandbox networkPolicy. A malformed document is 400 with line and reason, and
// changes nothing. With ?name= it puts the sandbox under that library policy.
func (a *policyAPI) handlePut(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if name := r.URL.Query().Get("name"); name != "" {
		a.applyNamed(w, r, id, name)
		return
	}
	body, err := readBody(r)
	if err != nil {
		fail(a.log, w, r, err)
		return
	}
	err = a.change(r, id, "put", func(*policies.Policy) (*policies.Policy, error) {
		p, err := policies.Parse("request body", body)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
		}
		return p, nil
	})
	if err != nil {
		fail(a.log, w, r, err)
		return
	}
	a.write(w, r, id)
}

// applyNamed answers PUT /v1/sandboxes/{id}/policy?name=NAME.
func (a *policyAPI) applyNamed(w http.ResponseWriter, r *http.Request, id, name string) {
	if err := a.setNamed(r, id, name); err != nil {
		fail(a.log, w, r, err)
		return
	}
	a.write(w, r, id)
}

// setNamed puts sandbox id under library policy name, audits the change (change
// named) and waits until the data plane enforces it (await).
func (a *policyAPI) setNamed(r *http.Request, id, name string) error {
	v, err := a.reg.SetNamedPolicy(id, name)
	if a.audit != nil && err == nil {
		a.audit.Append(audit.Record{
			Time: time.Now(), SandboxID: id, Source: audit.SourcePolicy, Src: r.RemoteAddr,
			Action: string(policies.Allow), Reason: "policy changed: named " + name, PolicyVersion: v,
			Extra: map[string]any{"change": "named", "policy": name, "route": r.Method + " " + r.URL.Path, "principal": principal.IDFromContext(r.Context())},
		})
	}
	if err != nil {
		return err
	}
	a.log.Info("policy changed", "sandbox_id", id, "change", "named", "policy", name, "policy_version", v)
	a.await(r.Context(), id, v)
	return nil
}

// handlePatch merges a JSON array of rules (OpenSandbox PATCH /policy semantics:
// incoming rules first, an incoming target replaces the existing rule).
func (a *policyAPI) handlePatch(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := a.patch(r, id); err != nil {
		fail(a.log, w, r, err)
		return
	}
	a.write(w, r, id)
}

// handleDelete removes the rules whose targets the JSON array names.
func (a *policyAPI) handleDelete(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := a.removeTargets(r, id); err != nil {
		fail(a.log, w, r, err)
		return
	}
	a.write(w, r, id)
}

// patch merges the body's rules into the sandbox's policy. With ?mode=enforce|audit
// (an Airlock extension) it also sets the policy's mode, and the body may be empty:
// PATCH /policy?mode=audit runs the sandbox's policy in audit, ?mode=enforce enforces
// it again.
func (a *policyAPI) patch(r *http.Request, id string) error {
	var mode policies.Mode
	if q := r.URL.Query().Get("mode"); q != "" {
		m, err := policies.ParseMode(q)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
		}
		mode = m
	}
	body, err := readBody(r)
	if mode != "" && errors.Is(err, errEmptyBody) {
		body, err = []byte("[]"), nil
	}
	if err != nil {
		return err
	}
	var rules []policies.Rule
	if mode == "" || strings.TrimSpace(string(body)) != "[]" {
		if rules, err = policies.ParseRules("request body", body); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
		}
	}
	kind := "patch"
	if mode != "" {
		kind = "patch mode " + string(mode)
	}
	return a.change(r, id, kind, func(cur *policies.Policy) (*policies.Policy, error) {
		p, err := policies.Patch(cur, rules)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
		}
		if mode != "" {
			p.Mode = mode
		}
		return p, nil
	})
}

func (a *policyAPI) removeTargets(r *http.Request, id string) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	targets, err := policies.ParseTargets("request body", body)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	if base, name := a.namedBase(id); base != nil {
		if inNamed, _ := policies.RemoveTargets(base, targets); inNamed != nil && len(inNamed.Egress) != len(base.Egress) {
			return fmt.Errorf("%w: a target is a rule of the named policy %q, which this sandbox runs under: edit its file, or PUT a policy of the sandbox's own", ErrInvalidRequest, name)
		}
	}
	return a.change(r, id, "delete", func(cur *policies.Policy) (*policies.Policy, error) {
		p, err := policies.RemoveTargets(cur, targets)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
		}
		return p, nil
	})
}

// serveEgressAPI answers the OpenSandbox egress API (egress-api.yaml, /policy) for
// sandbox port 18080 reached through the server proxy: GET returns the policy status,
// PATCH merges rules, DELETE removes targets; every change is persisted and published
// to the data plane like PUT /v1/sandboxes/{id}/policy. rest is the path below the
// port; /credential-vault… goes to the vault.
func (a *policyAPI) serveEgressAPI(w http.ResponseWriter, r *http.Request, id, rest string) {
	if rest == vaultPrefix || strings.HasPrefix(rest, vaultPrefix+"/") {
		a.vault.serve(w, r, id, rest)
		return
	}
	if rest != "/policy" {
		fail(a.log, w, r, fmt.Errorf("%w: the egress API serves /policy and /credential-vault", ErrNoRoute))
		return
	}
	var err error
	switch r.Method {
	case http.MethodGet:
	case http.MethodPatch:
		err = a.patch(r, id)
	case http.MethodDelete:
		err = a.removeTargets(r, id)
	default:
		w.Header().Set("Allow", "GET, PATCH, DELETE")
		fail(a.log, w, r, fmt.Errorf("%w: %s /policy", ErrNoRoute, r.Method))
		return
	}
	if err != nil {
		fail(a.log, w, r, err)
		return
	}
	p, _, err := storedPolicy(a.reg, id)
	if err != nil {
		fail(a.log, w, r, err)
		return
	}
	if p == nil {
		// No policy: the data plane's default, spelled out (the SDK expects a policy).
		if p, err = policies.Parse(id, DefaultPolicy); err != nil {
			fail(a.log, w, r, err)
			return
		}
	}
	opensandbox.WriteJSON(w, http.StatusOK, policies.Status(p, "dns+datapath"))
}

// readBody reads a request body of at most maxBody bytes.
func readBody(r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidJSON, err)
	}
	if len(b) > maxBody {
		return nil, fmt.Errorf("%w: the body exceeds %d bytes", ErrInvalidJSON, maxBody)
	}
	if len(b) == 0 {
		return nil, errEmptyBody
	}
	return b, nil
}

// errEmptyBody is readBody's error for a request without a body.
var errEmptyBody = fmt.Errorf("%w: the body is empty", ErrInvalidJSON)
