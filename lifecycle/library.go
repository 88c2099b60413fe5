package lifecycle

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/policies/library"
)

// ExtPolicy is the create request's extension naming a policy of the operator's
// library (Config.Library): {"extensions": {"airlock.dev/policy": "python-packages"}}.
// A networkPolicy given with it holds per-sandbox additions: its rules go before the
// named policy's (OpenSandbox PATCH semantics) and its defaultAction is the named one's.
const ExtPolicy = "airlock.dev/policy"

// PolicyLibrary is the operator's named policies (package policies/library).
type PolicyLibrary interface {
	Get(name string) (library.Policy, bool)
	List() []library.Policy
}

// failClosed is the policy of a sandbox whose named policy the library no longer has
// (its store was wiped): nothing leaves.
var failClosed = json.RawMessage(`{"defaultAction":"deny","egress":[]}`)

// NamedPolicy is one policy of the library as the API shows it (GET /v1/policies).
type NamedPolicy struct {
	library.Policy
	// Sandboxes counts the sandboxes that run under it.
	Sandboxes int `json:"sandboxes"`
	// Document is the parsed policy (Airlock JSON form); Source the file's text (only
	// in GET /v1/policies/{name}).
	Document json.RawMessage `json:"policy,omitempty"`
	Source   string          `json:"source,omitempty"`
}

func (s *Server) libraryRoutes() {
	s.mux.HandleFunc("GET /policies", s.handleListNamed)
	s.mux.HandleFunc("GET /policies/{name}", s.handleGetNamed)
}

// named returns the library's policy name (not removed unless allowRemoved).
func (s *Server) named(name string, allowRemoved bool) (library.Policy, error) {
	if s.cfg.Library == nil {
		return library.Policy{}, fmt.Errorf("%w: this server has no policy library (policies.dir)", ErrInvalidRequest)
	}
	p, ok := s.cfg.Library.Get(name)
	if !ok || (p.Removed && !allowRemoved) {
		return library.Policy{}, fmt.Errorf("%w: policy %q is not in the library (airlock policy list)", ErrInvalidRequest, name)
	}
	return p, nil
}

// effectiveLocked is rec's policy as the data plane enforces it and its version: the
// stored document, or for a sandbox under a named policy that policy with the
// sandbox's additions put first, versioned additions + named version (both only grow).
// s.mu is held.
func (s *Server) effectiveLocked(rec *record) (json.RawMessage, uint64) {
	if rec.PolicyName == "" {
		return rec.Policy, rec.PolicyVersion
	}
	var np library.Policy
	ok := s.cfg.Library != nil
	if ok {
		np, ok = s.cfg.Library.Get(rec.PolicyName)
	}
	if !ok {
		return failClosed, rec.PolicyVersion
	}
	eff := np.Policy
	if len(rec.Policy) > 0 && string(rec.Policy) != "null" {
		add, err := policies.Parse(rec.ID, rec.Policy)
		if err == nil {
			eff, err = policies.Patch(np.Policy, add.Egress)
		}
		if err != nil { // additions that no longer fit the named policy: fail closed
			s.log.Error("sandbox's policy additions do not combine with its named policy", "sandbox_id", rec.ID,
				"policy", rec.PolicyName, "err", err)
			return failClosed, rec.PolicyVersion + np.Version
		}
	}
	b, err := json.Marshal(eff)
	if err != nil {
		return failClosed, rec.PolicyVersion + np.Version
	}
	return b, rec.PolicyVersion + np.Version
}

// NamedPolicyChanged republishes every sandbox under policy name (its library version
// changed), so the data plane enforces the new version. The library's OnEvent calls it.
// It performs no I/O: records are unchanged, only their effective policy is.
func (s *Server) NamedPolicyChanged(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.sbx {
		if e.rec.PolicyName == name && !e.rec.Status.State.Terminal() {
			s.hub.Put(s.watchView(e.rec))
			n++
		}
	}
	return n
}

// SetNamedPolicy puts sandbox id under library policy name, dropping its own document
// or additions, and returns the effective version.
func (s *Server) SetNamedPolicy(id, name string) (uint64, error) {
	np, err := s.named(name, false)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sbx[id]
	if !ok {
		return 0, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	rec := e.rec
	if rec.PolicyName == name && len(rec.Policy) == 0 {
		_, v := s.effectiveLocked(rec)
		return v, nil
	}
	_, oldV := s.effectiveLocked(rec)
	oldName, oldDoc, oldAdd := rec.PolicyName, rec.Policy, rec.PolicyVersion
	rec.PolicyName, rec.Policy = name, nil
	rec.PolicyVersion = 1
	if oldV+1 > np.Version {
		rec.PolicyVersion = oldV + 1 - np.Version
	}
	if err := s.commitLocked(rec); err != nil {
		rec.PolicyName, rec.Policy, rec.PolicyVersion = oldName, oldDoc, oldAdd
		return 0, err
	}
	_, v := s.effectiveLocked(rec)
	return v, nil
}

// PolicyName is the library policy sandbox id runs under ("" for none).
func (s *Server) PolicyName(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.sbx[id]; ok {
		return e.rec.PolicyName
	}
	return ""
}

// applyNamed answers PUT /v1/sandboxes/{id}/policy?name=NAME.
func (s *Server) applyNamed(w http.ResponseWriter, r *http.Request, id, name string) {
	v, err := s.SetNamedPolicy(id, name)
	if s.cfg.Audit != nil && err == nil {
		s.cfg.Audit.Append(audit.Record{
			Time: time.Now(), SandboxID: id, Source: audit.SourcePolicy, Src: r.RemoteAddr,
			Action: string(policies.Allow), Reason: "policy changed: named " + name, PolicyVersion: v,
			Extra: map[string]any{"change": "named", "policy": name, "route": r.Method + " " + r.URL.Path},
		})
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("policy changed", "sandbox_id", id, "change", "named", "policy", name, "policy_version", v)
	s.awaitPolicy(r.Context(), id, v)
	s.writePolicy(w, r, id)
}

func (s *Server) handleListNamed(w http.ResponseWriter, r *http.Request) {
	out := []NamedPolicy{}
	if s.cfg.Library != nil {
		count := map[string]int{}
		s.mu.Lock()
		for _, e := range s.sbx {
			if e.rec.PolicyName != "" && !e.rec.Status.State.Terminal() {
				count[e.rec.PolicyName]++
			}
		}
		s.mu.Unlock()
		for _, p := range s.cfg.Library.List() {
			out = append(out, NamedPolicy{Policy: p, Sandboxes: count[p.Name]})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleGetNamed(w http.ResponseWriter, r *http.Request) {
	p, err := s.named(r.PathValue("name"), true)
	if err != nil {
		s.fail(w, r, fmt.Errorf("%w: %v", ErrNotFound, err))
		return
	}
	doc, _ := json.Marshal(p.Policy)
	n := 0
	s.mu.Lock()
	for _, e := range s.sbx {
		if e.rec.PolicyName == p.Name && !e.rec.Status.State.Terminal() {
			n++
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, NamedPolicy{Policy: p, Sandboxes: n, Document: doc, Source: string(p.Source)})
}
