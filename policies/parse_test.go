package policies

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

// TestInvalidFixtures parses every testdata/invalid file and expects each line of its
// .err file to appear in the error text.
func TestInvalidFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/invalid/*")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, ".err") {
			continue
		}
		n++
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(strings.TrimSuffix(f, filepath.Ext(f)) + ".err")
			if err != nil {
				t.Fatalf("fixture without .err file: %v", err)
			}
			p, err := Parse(name, data)
			if err == nil {
				t.Fatalf("Parse accepted the invalid policy: %+v", p)
			}
			if p != nil {
				t.Errorf("Parse returned a policy with an error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error does not wrap ErrInvalid: %v", err)
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.Source != name {
				t.Errorf("error is not a *Error from %s: %#v", name, err)
			}
			for line := range strings.SplitSeq(strings.TrimSpace(string(want)), "\n") {
				if !strings.Contains(err.Error(), line) {
					t.Errorf("error text\n%s\nlacks\n%s", err, line)
				}
			}
		})
	}
	if n < 20 {
		t.Fatalf("only %d invalid fixtures found", n)
	}
}

func TestEmptyIsErrEmpty(t *testing.T) {
	for _, doc := range []string{"", "null", "~", "\n# just a comment\n"} {
		_, err := Parse("p", []byte(doc))
		if !errors.Is(err, ErrEmpty) || !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%q) = %v, want ErrEmpty and ErrInvalid", doc, err)
		}
	}
}

// TestGolden compiles every valid fixture and the shipped example policies and compares
// the compiled listing with its golden file (go test -run TestGolden -update rewrites).
func TestGolden(t *testing.T) {
	var files []string
	for _, pat := range []string{"testdata/valid/*", "../deploy/policies/*"} {
		m, err := filepath.Glob(pat)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 8 {
		t.Fatalf("only %d policies found", len(files))
	}
	for _, f := range files {
		name := filepath.Base(f)
		if st, err := os.Stat(f); err != nil || st.IsDir() || strings.HasSuffix(name, ".md") {
			continue
		}
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			d, err := Load(name, data, CompileOptions{Overlay: BaseOverlay(), Version: 7})
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			d.Dump(&buf)
			golden := filepath.Join("testdata/golden", name+".golden")
			if *update {
				if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./policies -run TestGolden -update)", err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Errorf("compiled %s differs from %s:\n--- got\n%s--- want\n%s", name, golden, buf.String(), want)
			}
		})
	}
}

func TestParseKeepsLinesAndDefaults(t *testing.T) {
	p, err := Parse("full.yaml", mustRead(t, "testdata/valid/full.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Egress[0].Line != 17 || p.Egress[1].Line != 19 {
		t.Errorf("rule lines = %d, %d; want 17, 19", p.Egress[0].Line, p.Egress[1].Line)
	}
	q, err := Parse("os.json", []byte(`{"egress":[{"action":"allow","target":"a.com"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if q.EffectiveDefault() != Deny || q.EffectiveMode() != Enforce || q.EffectiveL7() != L7Off || q.EffectiveAudit() != AuditAll {
		t.Errorf("defaults: %s %s %s %s", q.EffectiveDefault(), q.EffectiveMode(), q.EffectiveL7(), q.EffectiveAudit())
	}
}

func TestParseTargetNormalizes(t *testing.T) {
	cases := []struct{ in, want string }{
		{"PyPI.org.", "pypi.org"},
		{"*.Example.com", "*.example.com"},
		{"**", "*"},
		{"10.1.2.3", "10.1.2.3"},
		{"2001:DB8::/32", "2001:db8::/32"},
		{"_dmarc.example.com", "_dmarc.example.com"},
	}
	for _, c := range cases {
		got, err := ParseTarget(c.in)
		if err != nil || got.String() != c.want {
			t.Errorf("ParseTarget(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "*.", "a..b", "-a.com", "a-.com", "*.*.com", "a.*", "1.2.3", "300.1.1.1", "::g", strings.Repeat("a", 64) + ".com"} {
		if _, err := ParseTarget(bad); err == nil {
			t.Errorf("ParseTarget(%q) accepted", bad)
		}
	}
}

func TestShippedOverlaysParse(t *testing.T) {
	files, _ := filepath.Glob("../deploy/policies/overlays/*.yaml")
	if len(files) == 0 {
		t.Fatal("no shipped overlays")
	}
	for _, f := range files {
		o, err := ParseOverlay(filepath.Base(f), mustRead(t, f))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Compile(&Policy{}, CompileOptions{Overlay: BaseOverlay().Merge(o)}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestParseOverlay(t *testing.T) {
	o, err := ParseOverlay("overlay.yaml", []byte("alwaysDeny:\n  - 10.9.0.1\n  - {target: \"*.corp.example\", ports: [443]}\nalwaysAllow:\n  - mirror.corp.example\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(o.AlwaysDeny) != 2 || o.AlwaysDeny[1].Action != Deny || len(o.AlwaysAllow) != 1 || o.AlwaysAllow[0].Action != Allow {
		t.Fatalf("overlay = %+v", o)
	}
	_, err = ParseOverlay("overlay.yaml", []byte("alwaysDeny:\n  - {action: allow, target: a.com}\nsometimes: []\n"))
	if err == nil || !strings.Contains(err.Error(), `overlay.yaml:2:5: alwaysDeny[0]: action "allow" contradicts`) ||
		!strings.Contains(err.Error(), `overlay.yaml:3:1: sometimes: unknown key`) {
		t.Errorf("ParseOverlay error = %v", err)
	}
	if err := (&Overlay{}).Deny("foo.*.com"); !errors.Is(err, ErrInvalid) {
		t.Errorf("Deny(bad) = %v", err)
	}
	BaseOverlay() // panics if BuiltinDeny is invalid
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
