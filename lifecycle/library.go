package lifecycle

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/policies/library"
)

// ExtPolicy is the create request's extension naming a policy of the operator's
// library (Config.Library): {"extensions": {"airlock.dev/policy": "python-packages"}}.
// A networkPolicy given with it holds per-sandbox additions: its rules go before the
// named policy's (OpenSandbox PATCH semantics) and its defaultAction is the named one's;
// its mode, when set, is the sandbox's (`mode: audit` runs the named policy in audit).
const ExtPolicy = "airlock.dev/policy"

// PolicyLibrary is the operator's named policies (package policies/library). Get and
// List read memory only.
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
	// Sandboxes counts the sandboxes that run under it; Pinned those of them pinned to
	// the version a snapshot captured (restored sandboxes; they do not follow the
	// library's changes).
	Sandboxes int `json:"sandboxes"`
	Pinned    int `json:"pinned,omitempty"`
	// Document is the parsed policy (Airlock JSON form); Source the file's text (only
	// in GET /v1/policies/{name}).
	Document json.RawMessage `json:"policy,omitempty"`
	Source   string          `json:"source,omitempty"`
}

// policyLibrary resolves library policies for the Server and the policy API: which
// names exist, and a sandbox's effective policy under its named one. It performs no
// I/O.
type policyLibrary struct {
	lib PolicyLibrary // nil: the server has no library
	log *slog.Logger
}

// named returns the library's policy name (not removed unless allowRemoved); errors
// wrap ErrInvalidRequest.
func (l *policyLibrary) named(name string, allowRemoved bool) (library.Policy, error) {
	if l.lib == nil {
		return library.Policy{}, fmt.Errorf("%w: this server has no policy library (policies.dir)", ErrInvalidRequest)
	}
	p, ok := l.lib.Get(name)
	if !ok || (p.Removed && !allowRemoved) {
		return library.Policy{}, fmt.Errorf("%w: policy %q is not in the library (airlock policy list)", ErrInvalidRequest, name)
	}
	return p, nil
}

// effective is rec's policy as the data plane enforces it and its version: the stored
// document, or for a sandbox under a named policy that policy (its pinned document when
// pinned, else the library's current version) with the sandbox's additions put first,
// versioned additions + named version (both only grow). rec must not change during the
// call (the caller holds the registry lock).
func (l *policyLibrary) effective(rec *record) (json.RawMessage, uint64) {
	if rec.PolicyName == "" {
		return rec.Policy, rec.PolicyVersion
	}
	named, namedV, ok := l.base(rec)
	if !ok {
		return failClosed, rec.PolicyVersion + namedV
	}
	eff := named
	if len(rec.Policy) > 0 && string(rec.Policy) != "null" {
		add, err := policies.Parse(rec.ID, rec.Policy)
		if err == nil {
			eff, err = policies.Patch(named, add.Egress)
		}
		if err == nil && add.Mode != "" {
			eff.Mode = add.Mode // the sandbox runs the named policy in its own mode (audit first)
		}
		if err != nil { // additions that no longer fit the named policy: fail closed
			l.log.Error("sandbox's policy additions do not combine with its named policy", "sandbox_id", rec.ID,
				"policy", rec.PolicyName, "err", err)
			return failClosed, rec.PolicyVersion + namedV
		}
	}
	b, err := json.Marshal(eff)
	if err != nil {
		return failClosed, rec.PolicyVersion + namedV
	}
	return b, rec.PolicyVersion + namedV
}

// libraryAPI serves the library of named policies: GET /policies (each with the count
// of sandboxes under it) and GET /policies/{name} (with its document and source).
type libraryAPI struct {
	lib *policyLibrary
	// each runs fn on every sandbox record under the registry lock (Server.each).
	reg interface{ each(fn func(rec *record)) }
	log *slog.Logger
}

func (a *libraryAPI) routes(m *http.ServeMux) {
	m.HandleFunc("GET /policies", a.handleList)
	m.HandleFunc("GET /policies/{name}", a.handleGet)
}

// users counts the live (not terminal) sandboxes under each named policy, and those of
// them pinned to a version of it.
func (a *libraryAPI) users() (count, pinned map[string]int) {
	count, pinned = map[string]int{}, map[string]int{}
	a.reg.each(func(rec *record) {
		if rec.PolicyName != "" && !rec.Status.State.Terminal() {
			count[rec.PolicyName]++
			if rec.PinnedPolicy != nil {
				pinned[rec.PolicyName]++
			}
		}
	})
	return count, pinned
}

func (a *libraryAPI) handleList(w http.ResponseWriter, r *http.Request) {
	out := []NamedPolicy{}
	if a.lib.lib != nil {
		count, pinned := a.users()
		for _, p := range a.lib.lib.List() {
			out = append(out, NamedPolicy{Policy: p, Sandboxes: count[p.Name], Pinned: pinned[p.Name]})
		}
	}
	opensandbox.WriteJSON(w, http.StatusOK, out)
}

func (a *libraryAPI) handleGet(w http.ResponseWriter, r *http.Request) {
	p, err := a.lib.named(r.PathValue("name"), true)
	if err != nil {
		fail(a.log, w, r, fmt.Errorf("%w: %v", ErrNotFound, err))
		return
	}
	doc, _ := json.Marshal(p.Policy)
	count, pinned := a.users()
	opensandbox.WriteJSON(w, http.StatusOK, NamedPolicy{Policy: p, Sandboxes: count[p.Name], Pinned: pinned[p.Name], Document: doc, Source: string(p.Source)})
}
