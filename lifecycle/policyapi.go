package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies"
)

// PolicyResponse is the answer of Airlock's own policy API
// (GET/PUT/PATCH/DELETE /v1/sandboxes/{id}/policy).
type PolicyResponse struct {
	SandboxID string `json:"sandboxId"`
	// Name is the library policy the sandbox runs under (Policy is then that policy
	// with the sandbox's additions first); empty for a policy of its own.
	Name string `json:"name,omitempty"`
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

// AuditResponse is the answer of GET /v1/sandboxes/{id}/audit.
type AuditResponse struct {
	Records []audit.Record `json:"records"`
	// More is true when records beyond limit exist: ask again with after=<last seq>.
	More bool `json:"more"`
}

func (s *Server) policyRoutes() {
	m := s.mux
	m.HandleFunc("GET /sandboxes/{id}/policy", s.handleGetPolicy)
	m.HandleFunc("PUT /sandboxes/{id}/policy", s.handlePutPolicy)
	m.HandleFunc("PATCH /sandboxes/{id}/policy", s.handlePatchPolicy)
	m.HandleFunc("DELETE /sandboxes/{id}/policy", s.handleDeletePolicy)
	m.HandleFunc("GET /sandboxes/{id}/audit", s.handleAudit)
}

// parsedPolicy returns the sandbox's policy parsed (nil when it has none).
func (s *Server) parsedPolicy(id string) (*policies.Policy, uint64, error) {
	raw, v, err := s.Policy(id)
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

// DefaultPolicy is what a sandbox without a policy gets from the data plane (egressd's
// default: allow, minus the operator overlay and special addresses, as OpenSandbox does
// without a networkPolicy). The egress API reports it, and PATCH/DELETE start from it.
var DefaultPolicy = json.RawMessage(`{"defaultAction":"allow","egress":[]}`)

// changePolicy applies change to the sandbox's current policy (DefaultPolicy when it
// has none) atomically, persists the result (Airlock JSON form) and audits the attempt:
// action allow when applied, deny when the change was rejected.
func (s *Server) changePolicy(r *http.Request, id, kind string, change func(cur *policies.Policy) (*policies.Policy, error)) error {
	// A put replaces the whole policy (a sandbox under a named policy leaves it); a
	// patch or delete changes the additions of a named sandbox.
	v, err := s.updatePolicy(id, kind == "put", func(raw json.RawMessage) (json.RawMessage, error) {
		if len(raw) == 0 || string(raw) == "null" {
			raw = DefaultPolicy
		}
		cur, err := policies.Parse(id, raw)
		if err != nil {
			return nil, fmt.Errorf("stored policy of %s: %w", id, err)
		}
		p, err := change(cur)
		if err != nil {
			return nil, err
		}
		return json.Marshal(p)
	})
	if errors.Is(err, ErrNotFound) {
		return err
	}
	if s.cfg.Audit != nil {
		rec := audit.Record{
			Time: time.Now(), SandboxID: id, Source: audit.SourcePolicy, Src: r.RemoteAddr,
			Action: string(policies.Allow), Reason: "policy changed: " + kind, PolicyVersion: v,
			Extra: map[string]any{"change": kind, "route": r.Method + " " + r.URL.Path},
		}
		if err != nil {
			rec.Action, rec.Reason = string(policies.Deny), "policy change rejected: "+err.Error()
		}
		s.cfg.Audit.Append(rec)
	}
	if err != nil {
		return err
	}
	s.log.Info("policy changed", "sandbox_id", id, "change", kind, "policy_version", v)
	s.awaitPolicy(r.Context(), id, v)
	return nil
}

// awaitPolicy hands the runtime's second layer the new egress (EgressUpdater), then
// waits until Config.PolicyGate confirms that version v of a Running
// sandbox's policy is enforced, at most PolicyApplyTimeout; a change that is not
// confirmed in time is logged (it stays stored and the data plane applies it late).
func (s *Server) awaitPolicy(ctx context.Context, id string, v uint64) {
	s.updateEgress(ctx, id)
	if s.cfg.PolicyGate == nil {
		return
	}
	s.mu.Lock()
	e, ok := s.sbx[id]
	running := ok && e.rec.Status.State == opensandbox.Running
	s.mu.Unlock()
	if !running {
		return
	}
	deadline := time.Now().Add(s.cfg.PolicyApplyTimeout)
	for !s.cfg.PolicyGate(id, v) {
		if time.Now().After(deadline) {
			s.log.Warn("policy change not confirmed enforced in time", "sandbox_id", id, "policy_version", v,
				"timeout", s.cfg.PolicyApplyTimeout)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (s *Server) writePolicy(w http.ResponseWriter, r *http.Request, id string) {
	p, v, err := s.parsedPolicy(id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	resp := PolicyResponse{SandboxID: id, Name: s.PolicyName(id), Version: v, Policy: json.RawMessage("null")}
	if p != nil {
		resp.Policy, _ = json.Marshal(p)
		np, lossless := policies.ToNetworkPolicy(p)
		resp.NetworkPolicy, resp.Lossless = &np, lossless
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) handleGetPolicy(w http.ResponseWriter, r *http.Request) {
	s.writePolicy(w, r, r.PathValue("id"))
}

// handlePutPolicy replaces the policy with the body: an Airlock policy (YAML or JSON)
// or an OpenSandbox networkPolicy. A malformed document is 400 with line and reason,
// and changes nothing.
func (s *Server) handlePutPolicy(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if name := r.URL.Query().Get("name"); name != "" {
		s.applyNamed(w, r, id, name)
		return
	}
	body, err := readBody(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	err = s.changePolicy(r, id, "put", func(*policies.Policy) (*policies.Policy, error) {
		p, err := policies.Parse("request body", body)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
		}
		return p, nil
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.writePolicy(w, r, id)
}

// handlePatchPolicy merges a JSON array of rules (OpenSandbox PATCH /policy
// semantics: incoming rules first, an incoming target replaces the existing rule).
func (s *Server) handlePatchPolicy(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := s.patchPolicy(r, id); err != nil {
		s.fail(w, r, err)
		return
	}
	s.writePolicy(w, r, id)
}

// handleDeletePolicy removes the rules whose targets the JSON array names.
func (s *Server) handleDeletePolicy(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := s.removeTargets(r, id); err != nil {
		s.fail(w, r, err)
		return
	}
	s.writePolicy(w, r, id)
}

func (s *Server) patchPolicy(r *http.Request, id string) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	rules, err := policies.ParseRules("request body", body)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	return s.changePolicy(r, id, "patch", func(cur *policies.Policy) (*policies.Policy, error) {
		p, err := policies.Patch(cur, rules)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
		}
		return p, nil
	})
}

func (s *Server) removeTargets(r *http.Request, id string) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	targets, err := policies.ParseTargets("request body", body)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	if name := s.PolicyName(id); name != "" {
		if np, err := s.named(name, true); err == nil {
			if inNamed, _ := policies.RemoveTargets(np.Policy, targets); inNamed != nil && len(inNamed.Egress) != len(np.Policy.Egress) {
				return fmt.Errorf("%w: a target is a rule of the named policy %q, which this sandbox runs under: edit its file, or PUT a policy of the sandbox's own", ErrInvalidRequest, name)
			}
		}
	}
	return s.changePolicy(r, id, "delete", func(cur *policies.Policy) (*policies.Policy, error) {
		p, err := policies.RemoveTargets(cur, targets)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
		}
		return p, nil
	})
}

// handleEgressAPI answers the OpenSandbox egress API (egress-api.yaml, /policy) for
// sandbox port 18080 reached through the server proxy: GET returns the policy status,
// PATCH merges rules, DELETE removes targets; every change is persisted and published
// to the data plane like PUT /v1/sandboxes/{id}/policy.
func (s *Server) handleEgressAPI(w http.ResponseWriter, r *http.Request, id, rest string) {
	if rest == vaultPrefix || strings.HasPrefix(rest, vaultPrefix+"/") {
		s.handleVaultAPI(w, r, id, rest)
		return
	}
	if rest != "/policy" {
		s.fail(w, r, fmt.Errorf("%w: the egress API serves /policy and /credential-vault", ErrNoRoute))
		return
	}
	var err error
	switch r.Method {
	case http.MethodGet:
	case http.MethodPatch:
		err = s.patchPolicy(r, id)
	case http.MethodDelete:
		err = s.removeTargets(r, id)
	default:
		w.Header().Set("Allow", "GET, PATCH, DELETE")
		s.fail(w, r, fmt.Errorf("%w: %s /policy", ErrNoRoute, r.Method))
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	p, _, err := s.parsedPolicy(id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if p == nil {
		// No policy: the data plane's default, spelled out (the SDK expects a policy).
		if p, err = policies.Parse(id, DefaultPolicy); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, policies.Status(p, "dns+datapath"))
}

// handleAudit answers GET /v1/sandboxes/{id}/audit?since=&until=&after=&limit= from the
// audit log: since and until are RFC 3339 times (since ≤ time < until), after a seq
// to continue from, limit at most 10000 (default 1000).
func (s *Server) handleAudit(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if s.cfg.AuditDir == "" {
		s.fail(w, r, fmt.Errorf("%w: no audit log is configured", ErrNotImplemented))
		return
	}
	q := r.URL.Query()
	f := audit.Filter{SandboxID: id, Limit: 1000}
	for _, tf := range []struct {
		name string
		dst  *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if v := q.Get(tf.name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				s.fail(w, r, fmt.Errorf("%w: %s must be an RFC 3339 time (2026-11-22T18:00:00Z)", ErrInvalidRequest, tf.name))
				return
			}
			*tf.dst = t
		}
	}
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			s.fail(w, r, fmt.Errorf("%w: after must be a record seq", ErrInvalidRequest))
			return
		}
		f.AfterSeq = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			s.fail(w, r, fmt.Errorf("%w: limit must be from 1 to 10000", ErrInvalidRequest))
			return
		}
		f.Limit = n
	}
	recs, more, err := audit.Query(s.cfg.AuditDir, f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if recs == nil {
		recs = []audit.Record{}
	}
	writeJSON(w, http.StatusOK, AuditResponse{Records: recs, More: more})
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
		return nil, fmt.Errorf("%w: the body is empty", ErrInvalidJSON)
	}
	return b, nil
}
