package route

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/gateway/signedurl"
)

var domains = []string{"sandbox.example.com", "airlock.localhost"}

const tag = "0123456789abca" // 13 MAC chars + key id "a"

func TestParse(t *testing.T) {
	cases := []struct {
		name string
		in   Input
		want []Candidate
		err  error
	}{
		{name: "header_id_port", in: Input{IngressTo: "abc-8080", Host: "8081-zzz.airlock.localhost"},
			want: []Candidate{{ID: "abc", Port: 8080, Form: FormHeader}}},
		{name: "header_port_id", in: Input{IngressTo: "8080-abc"},
			want: []Candidate{{ID: "abc", Port: 8080, Form: FormHeader}}},
		{name: "header_dashed_id_both_readings", in: Input{IngressTo: "8080-my-box-2"},
			want: []Candidate{{ID: "my-box-2", Port: 8080, Form: FormHeader}, {ID: "8080-my-box", Port: 2, Form: FormHeader}}},
		{name: "header_signed_osep_order", in: Input{IngressTo: "my-box-8080-x2qxvk-" + tag},
			want: []Candidate{
				{ID: "my-box", Port: 8080, Form: FormHeader, Signed: true, ExpiresB36: "x2qxvk", Tag: tag},
				{ID: "my-box-8080-x2qxvk", Port: 0, Form: FormHeader}, // placeholder, removed below
			}},
		{name: "header_malformed_does_not_fall_through", in: Input{IngressTo: "nope", Path: "/abc/8080/"}, err: ErrMalformed},
		{name: "airlock_headers", in: Input{HasAirlock: true, Sandbox: "abc-1", Port: "44772"},
			want: []Candidate{{ID: "abc-1", Port: 44772, Form: FormAirlockHeader}}},
		{name: "airlock_headers_bad_port", in: Input{HasAirlock: true, Sandbox: "abc", Port: "0"}, err: ErrMalformed},
		{name: "airlock_headers_missing_port", in: Input{HasAirlock: true, Sandbox: "abc"}, err: ErrMalformed},
		{name: "host_port_first", in: Input{Host: "8080-abc.airlock.localhost:8081", Path: "/x"},
			want: []Candidate{{ID: "abc", Port: 8080, Form: FormHost}}},
		{name: "host_id_first", in: Input{Host: "abc-8080.airlock.localhost"},
			want: []Candidate{{ID: "abc", Port: 8080, Form: FormHost}}},
		{name: "host_uppercase_trailing_dot", in: Input{Host: "8080-ABC.Airlock.Localhost.:80"},
			want: []Candidate{{ID: "abc", Port: 8080, Form: FormHost}}},
		{name: "host_dashed_id_ambiguous", in: Input{Host: "8080-abc-9.sandbox.example.com"},
			want: []Candidate{{ID: "abc-9", Port: 8080, Form: FormHost}, {ID: "8080-abc", Port: 9, Form: FormHost}}},
		{name: "host_signed_port_first", in: Input{Host: "8080-abc-def-x2qxvk-" + tag + ".airlock.localhost"},
			want: []Candidate{
				{ID: "abc-def", Port: 8080, Form: FormHost, Signed: true, ExpiresB36: "x2qxvk", Tag: tag},
				{ID: "abc-def-x2qxvk-" + tag, Port: 8080, Form: FormHost},
			}},
		{name: "host_nested_label", in: Input{Host: "a.8080-abc.airlock.localhost"}, err: ErrMalformed},
		{name: "host_label_without_port", in: Input{Host: "www.airlock.localhost", Path: "/abc/80"}, err: ErrMalformed},
		{name: "host_base_domain_itself_uses_path", in: Input{Host: "airlock.localhost:8081", Path: "/sandboxes/abc/proxy/80/x"},
			want: []Candidate{{ID: "abc", Port: 80, Form: FormPathProxy, Prefix: "/sandboxes/abc/proxy/80"}}},
		{name: "host_other_domain_uses_path", in: Input{Host: "8080-abc.example.org", Path: "/abc/80"},
			want: []Candidate{{ID: "abc", Port: 80, Form: FormPath, Prefix: "/abc/80"}}},
		{name: "host_suffix_not_label_boundary", in: Input{Host: "8080-abcairlock.localhost", Path: "/"}, err: ErrNoRoute},
		{name: "host_ipv6_literal", in: Input{Host: "[::1]:8081", Path: "/abc/80/"},
			want: []Candidate{{ID: "abc", Port: 80, Form: FormPath, Prefix: "/abc/80"}}},
		{name: "path_proxy", in: Input{Host: "127.0.0.1:8081", Path: "/sandboxes/abc-1/proxy/44772/ping"},
			want: []Candidate{{ID: "abc-1", Port: 44772, Form: FormPathProxy, Prefix: "/sandboxes/abc-1/proxy/44772"}}},
		{name: "path_port_alias", in: Input{Path: "/sandboxes/abc/port/8080"},
			want: []Candidate{{ID: "abc", Port: 8080, Form: FormPathProxy, Prefix: "/sandboxes/abc/port/8080"}}},
		{name: "path_proxy_numeric_id_also_short", in: Input{Path: "/sandboxes/123/proxy/80/"},
			want: []Candidate{{ID: "123", Port: 80, Form: FormPathProxy, Prefix: "/sandboxes/123/proxy/80"},
				{ID: "sandboxes", Port: 123, Form: FormPath, Prefix: "/sandboxes/123"}}},
		{name: "path_short", in: Input{Path: "/abc/8080/a/b?c"},
			want: []Candidate{{ID: "abc", Port: 8080, Form: FormPath, Prefix: "/abc/8080"}}},
		{name: "path_short_signed", in: Input{Path: "/abc/8080/x2qxvk/" + tag + "/v1/status"},
			want: []Candidate{
				{ID: "abc", Port: 8080, Form: FormPath, Signed: true, ExpiresB36: "x2qxvk", Tag: tag, Prefix: "/abc/8080/x2qxvk/" + tag},
				{ID: "abc", Port: 8080, Form: FormPath, Prefix: "/abc/8080"}}},
		{name: "path_port_glued", in: Input{Path: "/abc/8080x"}, err: ErrNoRoute},
		{name: "path_port_leading_zero", in: Input{Path: "/abc/080/"}, err: ErrNoRoute},
		{name: "path_port_too_big", in: Input{Path: "/abc/65536/"}, err: ErrNoRoute},
		{name: "path_escaped_id", in: Input{Path: "/a%2Fb/80/"}, err: ErrNoRoute},
		{name: "path_root", in: Input{Path: "/"}, err: ErrNoRoute},
		{name: "path_empty", in: Input{}, err: ErrNoRoute},
	}
	// Fix the OSEP-order case: the unsigned readings of the whole label are invalid (tag is
	// not a port), so only the signed reading remains.
	cases[3].want = cases[3].want[:1]
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Parse(c.in, domains, make([]Candidate, 0, MaxCandidates))
			if !errors.Is(err, c.err) {
				t.Fatalf("err = %v, want %v", err, c.err)
			}
			if c.err != nil {
				return
			}
			if len(got) != len(c.want) {
				t.Fatalf("got %d candidates %+v, want %+v", len(got), got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Errorf("candidate %d = %+v, want %+v", i, got[i], c.want[i])
				}
			}
		})
	}
}

func TestRest(t *testing.T) {
	cases := []struct{ prefix, path, want string }{
		{"/sandboxes/a/proxy/80", "/sandboxes/a/proxy/80/x/y", "/x/y"},
		{"/sandboxes/a/proxy/80", "/sandboxes/a/proxy/80", "/"},
		{"/a/80", "/a/80/%2F", "/%2F"},
		{"", "/keep", "/keep"},
	}
	for _, c := range cases {
		if got := (Candidate{Prefix: c.prefix}).Rest(c.path); got != c.want {
			t.Errorf("Rest(%q, %q) = %q, want %q", c.prefix, c.path, got, c.want)
		}
	}
}

func TestFormString(t *testing.T) {
	for f, want := range map[Form]string{FormHeader: "header", FormAirlockHeader: "airlock_header",
		FormHost: "host", FormPathProxy: "path_proxy", FormPath: "path", Form(99): "unknown"} {
		if f.String() != want {
			t.Errorf("%d: %q", f, f.String())
		}
	}
}

// checkInvariants fails t when a candidate breaks what the gateway relies on.
func checkInvariants(t *testing.T, in Input, got []Candidate, err error) {
	t.Helper()
	if err == nil && len(got) == 0 {
		t.Fatalf("no error and no candidates for %+v", in)
	}
	if len(got) > MaxCandidates {
		t.Fatalf("%d candidates > MaxCandidates", len(got))
	}
	for _, c := range got {
		if !signedurl.ValidID(c.ID) || c.Port < 1 || c.Port > 65535 || c.Form == FormNone {
			t.Fatalf("invalid candidate %+v from %+v", c, in)
		}
		if c.Signed != (c.Tag != "") || (c.Signed && (!signedurl.ValidTag(c.Tag) || !signedurl.ValidExpiry(c.ExpiresB36))) {
			t.Fatalf("inconsistent signature in %+v", c)
		}
		isPath := c.Form == FormPath || c.Form == FormPathProxy
		if isPath != (c.Prefix != "") {
			t.Fatalf("prefix %q for form %s", c.Prefix, c.Form)
		}
		if isPath {
			if !strings.HasPrefix(in.Path, c.Prefix) || strings.HasSuffix(c.Prefix, "/") {
				t.Fatalf("prefix %q not a segment prefix of %q", c.Prefix, in.Path)
			}
			if r := c.Rest(in.Path); r != "/" && !strings.HasPrefix(r, "/") {
				t.Fatalf("rest %q of %q does not start at a segment", r, in.Path)
			}
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add("8080-abc.airlock.localhost", "/", "", "", "")
	f.Add("abc-8080.sandbox.example.com:443", "/x", "", "", "")
	f.Add("127.0.0.1:8081", "/sandboxes/abc/proxy/44772/ping", "", "", "")
	f.Add("", "/abc/8080/x2qxvk/"+tag+"/v1", "", "", "")
	f.Add("", "/", "my-box-8080-x2qxvk-"+tag, "", "")
	f.Add("", "/", "", "abc", "80")
	f.Fuzz(func(t *testing.T, host, path, ingress, sandbox, port string) {
		in := Input{Host: host, Path: path, IngressTo: ingress, Sandbox: sandbox, Port: port,
			HasAirlock: sandbox != "" || port != ""}
		got, err := Parse(in, domains, make([]Candidate, 0, MaxCandidates))
		checkInvariants(t, in, got, err)
		again, err2 := Parse(in, domains, nil)
		if !errors.Is(err2, err) || len(again) != len(got) {
			t.Fatalf("Parse is not deterministic")
		}
	})
}

// FuzzLabelRoundTrip checks that every host-safe id and port, written in either order and
// signed or not, parses back to a candidate with the same id and port.
func FuzzLabelRoundTrip(f *testing.F) {
	f.Add("abc", 8080)
	f.Add("my-box-2", 2)
	f.Add("123", 80)
	f.Add("a-8080", 44772)
	f.Fuzz(func(t *testing.T, id string, port int) {
		if !signedurl.HostSafeID(id) || port < 1 || port > 65535 || len(id) > 40 || id[0] == '-' || id[len(id)-1] == '-' {
			return
		}
		p := strconv.Itoa(port)
		for _, label := range []string{p + "-" + id, id + "-" + p, p + "-" + id + "-x2qxvk-" + tag, id + "-" + p + "-x2qxvk-" + tag} {
			got, err := Parse(Input{Host: label + ".airlock.localhost"}, domains, nil)
			if err != nil {
				t.Fatalf("%q: %v", label, err)
			}
			found := false
			for _, c := range got {
				found = found || (c.ID == id && c.Port == port)
			}
			if !found {
				t.Fatalf("%q: no candidate (%q, %d) in %+v", label, id, port, got)
			}
		}
	})
}

func BenchmarkParseHost(b *testing.B) {
	buf := make([]Candidate, 0, MaxCandidates)
	in := Input{Host: "8080-abc-1234.airlock.localhost:8081", Path: "/index.html"}
	for b.Loop() {
		_, _ = Parse(in, domains, buf)
	}
}
