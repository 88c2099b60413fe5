package policies

import (
	"os"
	"strings"
	"testing"
)

// TestBrowserAllowlistPreset: the shipped browser-allowlist preset parses and compiles;
// with a sandbox's additions put first (as lifecycle does for a named policy), the sites
// given are allowed on tcp 80/443, Chromium's background endpoints are denied
// by the preset's named rules, anything else by the default, and an addition for a
// name below a denied wildcard (or the wildcard itself) allows it.
func TestBrowserAllowlistPreset(t *testing.T) {
	data, err := os.ReadFile("../deploy/policies/browser-allowlist.yaml")
	if err != nil {
		t.Fatal(err)
	}
	preset, err := Parse("browser-allowlist.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	if preset.Name != "browser-allowlist" || preset.DefaultAction != Deny || preset.L7 != L7SNI {
		t.Fatalf("preset %q: default %s, l7 %s", preset.Name, preset.DefaultAction, preset.L7)
	}
	for _, r := range preset.Egress {
		if r.Action != Deny {
			t.Errorf("the preset allows %s by itself: a browser needs nothing but the sites given", r.Target)
		}
	}
	adds, err := Parse("additions", []byte(`{"egress":[{"action":"allow","target":"site-a.test"},{"action":"allow","target":"www.google.com"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	eff, err := Patch(preset, adds.Egress)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Compile(eff, CompileOptions{Overlay: BaseOverlay(), Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		port  uint16
		proto Protocol
		want  Action
		rule  string // prefix of Decision.Rule; "" = any
	}{
		{"site-a.test", 443, TCP, Allow, "egress[0]"},
		{"site-a.test", 80, TCP, Allow, "egress[0]"},
		{"www.google.com", 443, TCP, Allow, "egress[1]"},
		{"update.googleapis.com", 443, TCP, Deny, "egress["},
		{"safebrowsing.googleapis.com", 443, TCP, Deny, "egress["},
		{"optimizationguide-pa.googleapis.com", 443, TCP, Deny, "egress["},
		{"clients2.google.com", 443, TCP, Deny, "egress["},
		{"accounts.google.com", 443, TCP, Deny, "egress["},
		{"google.com", 443, TCP, Deny, "egress["},
		{"redirector.gvt1.com", 443, TCP, Deny, "egress["},
		{"example.org", 443, TCP, Deny, "default"},
	} {
		dec := d.DecideName(c.name, c.port, c.proto)
		if dec.Action != c.want || !strings.HasPrefix(dec.Rule, c.rule) {
			t.Errorf("%s %d/%s: %s by %s (%s), want %s by %s…", c.name, c.port, c.proto, dec.Action, dec.Rule, dec.Reason, c.want, c.rule)
		}
	}
	// An addition for the wildcard itself replaces the preset's denial.
	all, err := Parse("additions", []byte(`{"egress":[{"action":"allow","target":"*.googleapis.com"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	eff, err = Patch(preset, all.Egress)
	if err != nil {
		t.Fatal(err)
	}
	d, err = Compile(eff, CompileOptions{Version: 2})
	if err != nil {
		t.Fatal(err)
	}
	if dec := d.DecideName("storage.googleapis.com", 443, TCP); dec.Action != Allow {
		t.Errorf("storage.googleapis.com with *.googleapis.com added: %s by %s", dec.Action, dec.Rule)
	}
}
