package lifecycle

import (
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/policies/library"
)

// oneLibrary is a PolicyLibrary holding one named policy.
type oneLibrary struct{ p library.Policy }

func (l oneLibrary) Get(name string) (library.Policy, bool) { return l.p, name == l.p.Name }
func (l oneLibrary) List() []library.Policy                 { return []library.Policy{l.p} }

// TestNamedPolicyInAuditMode: a sandbox under a named policy whose additions carry
// mode: audit runs the named policy in audit; without a mode, in the named one's.
func TestNamedPolicyInAuditMode(t *testing.T) {
	named, err := policies.Parse("team.yaml", []byte("defaultAction: deny\negress: [{action: allow, target: pypi.org}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	l := &policyLibrary{lib: oneLibrary{library.Policy{Name: "team", Version: 1, Policy: named}}, log: slog.Default()}
	for _, c := range []struct {
		additions string
		want      policies.Mode
	}{
		{`{"mode":"audit","egress":[]}`, policies.AuditMode},
		{`{"egress":[{"action":"allow","target":"example.com"}]}`, policies.Enforce},
		{``, policies.Enforce},
	} {
		doc, _ := l.effective(&record{ID: "sb", PolicyName: "team", Policy: json.RawMessage(c.additions)})
		p, err := policies.Parse("effective", doc)
		if err != nil {
			t.Fatal(err)
		}
		if p.EffectiveMode() != c.want || len(p.Egress) == 0 || p.Egress[len(p.Egress)-1].Target != "pypi.org" {
			t.Errorf("additions %s: effective %s", c.additions, doc)
		}
	}
}
