package policies

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/testenv"
)

// httpHost compiles doc and returns the HTTP rules DecideName gives for host:443.
func httpHost(t testing.TB, doc, host string) *HTTPHost {
	t.Helper()
	d, err := Load("http.yaml", []byte(doc), CompileOptions{Overlay: BaseOverlay(), Version: 3})
	if err != nil {
		t.Fatal(err)
	}
	dec := d.DecideName(host, 443, TCP)
	if !dec.Allowed() || dec.HTTP == nil {
		t.Fatalf("DecideName(%s) = %+v, want allow with HTTP rules", host, dec)
	}
	return dec.HTTP
}

const githubLike = `
egress:
  - action: allow
    target: api.github.test
    http:
      rules:
        - {action: deny, methods: [DELETE], path: "/repos/*"}
        - {action: allow, methods: [POST], path: /graphql, headers: {Content-Type: application/json}}
        - {action: allow, methods: [PUT], path: /Upload/exact}
        - {action: deny, path: "/**/secret/*.key"}
      access: read-only
  - action: allow
    target: "*.git.test"
    http:
      git: [fetch]
  - action: allow
    target: other.test
`

// TestHTTPDecide checks first-match order, presets and the per-host default, and the
// matcher's normalisation: the method is upper-cased, the path is compared
// case-sensitively after percent-decoding, and a non-canonical path is refused. Each
// case with a "mutation" comment fails under a matcher that ignores that aspect.
func TestHTTPDecide(t *testing.T) {
	api := httpHost(t, githubLike, "api.github.test")
	git := httpHost(t, githubLike, "code.git.test")
	cases := []struct {
		name       string
		h          *HTTPHost
		method     string
		path       string
		query      string
		header     http.Header
		wantAction Action
		wantRule   string
	}{
		{"GetAllowedByPreset", api, "GET", "/repos/a/b", "", nil, Allow, "egress[0].http.access"},
		{"HeadAllowed", api, "HEAD", "/", "", nil, Allow, "egress[0].http.access"},
		{"DeleteDenied", api, "DELETE", "/repos/a/b", "", nil, Deny, "egress[0].http.rules[0]"},
		// mutation: a matcher that ignores the method allows or denies by path alone.
		{"PostDefault", api, "POST", "/repos/a/b", "", nil, Deny, "egress[0].http.default"},
		// mutation: a matcher that compares methods case-sensitively lets "delete" through.
		{"LowerCaseDelete", api, "delete", "/repos/a/b", "", nil, Deny, "egress[0].http.rules[0]"},
		{"LowerCaseGet", api, "get", "/x", "", nil, Allow, "egress[0].http.access"},
		// mutation: a matcher that does not decode the path misses the deny rule.
		{"EncodedPathDecoded", api, "DELETE", "/r%65pos/a", "", nil, Deny, "egress[0].http.rules[0]"},
		{"EncodedGlob", api, "GET", "/a/b/secr%65t/x.key", "", nil, Deny, "egress[0].http.rules[3]"},
		// mutation: a matcher that ignores path case would let /upload/exact in.
		{"PathCaseMatters", api, "PUT", "/upload/exact", "", nil, Deny, "egress[0].http.default"},
		{"PathExact", api, "PUT", "/Upload/exact", "", nil, Allow, "egress[0].http.rules[2]"},
		{"PathExactNotPrefix", api, "PUT", "/Upload/exact/more", "", nil, Deny, "egress[0].http.default"},
		{"PrefixCaseMatters", api, "DELETE", "/Repos/a", "", nil, Deny, "egress[0].http.default"},
		// mutation: a matcher that resolves dot segments itself (or ignores them) lets
		// /repos/../user through to the read-only preset or the default.
		{"DotSegmentRefused", api, "GET", "/repos/../user", "", nil, Deny, "egress[0].http.path"},
		{"EncodedDotRefused", api, "GET", "/repos/%2e%2e/user", "", nil, Deny, "egress[0].http.path"},
		{"DoubleSlashRefused", api, "GET", "//repos/a", "", nil, Deny, "egress[0].http.path"},
		{"HeaderMatches", api, "POST", "/graphql", "", http.Header{"Content-Type": {"application/json"}}, Allow, "egress[0].http.rules[1]"},
		{"HeaderMissing", api, "POST", "/graphql", "", nil, Deny, "egress[0].http.default"},
		{"HeaderOtherValue", api, "POST", "/graphql", "", http.Header{"Content-Type": {"text/plain"}}, Deny, "egress[0].http.default"},
		{"GitRefs", git, "GET", "/org/repo.git/info/refs", "service=git-upload-pack", nil, Allow, "egress[1].http.git.fetch"},
		{"GitUploadPack", git, "POST", "/org/repo.git/git-upload-pack", "", nil, Allow, "egress[1].http.git.fetch"},
		{"GitPushRefs", git, "GET", "/org/repo.git/info/refs", "service=git-receive-pack", nil, Deny, "egress[1].http.default"},
		{"GitReceivePack", git, "POST", "/org/repo.git/git-receive-pack", "", nil, Deny, "egress[1].http.default"},
		{"GitEncodedService", git, "GET", "/r/info/refs", "service=git-receive%2Dpack", nil, Deny, "egress[1].http.default"},
		{"GitRefsNoService", git, "GET", "/r/info/refs", "", nil, Deny, "egress[1].http.default"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dec := c.h.Decide(HTTPRequest{Method: c.method, EscapedPath: c.path, RawQuery: c.query, Header: c.header})
			if dec.Action != c.wantAction || dec.Rule != c.wantRule {
				t.Fatalf("%s %s?%s = %s by %s (%s), want %s by %s", c.method, c.path, c.query, dec.Action, dec.Rule, dec.Reason, c.wantAction, c.wantRule)
			}
			if dec.Version != 3 {
				t.Errorf("version %d, want 3", dec.Version)
			}
		})
	}
}

// TestHTTPNameWithoutRules: a host without HTTP rules has no HTTP decision, and a deny
// keeps none either.
func TestHTTPNameWithoutRules(t *testing.T) {
	d, err := Load("http.yaml", []byte(githubLike), CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if dec := d.DecideName("other.test", 443, TCP); !dec.Allowed() || dec.HTTP != nil {
		t.Fatalf("other.test: %+v", dec)
	}
	if dec := d.DecideName("nothing.test", 443, TCP); dec.Allowed() || dec.HTTP != nil {
		t.Fatalf("nothing.test: %+v", dec)
	}
	if d.L7() != L7SNI {
		t.Fatalf("L7() = %s, want sni (implied by http rules)", d.L7())
	}
}

// TestHTTPReportMode: in report mode a denied request passes, marked WouldDeny.
func TestHTTPReportMode(t *testing.T) {
	h := httpHost(t, "mode: report\n"+githubLike, "api.github.test")
	dec := h.Decide(HTTPRequest{Method: "DELETE", EscapedPath: "/repos/x"})
	if dec.Action != Allow || !dec.WouldDeny || dec.Rule != "egress[0].http.rules[0]" {
		t.Fatalf("%+v", dec)
	}
}

// TestHTTPRoundTrip: the JSON form (what lifecycle stores) parses back to the same rules.
func TestHTTPRoundTrip(t *testing.T) {
	p, err := Parse("a.yaml", []byte(githubLike))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	q, err := Parse("a.json", b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	b2, _ := json.Marshal(q)
	if string(b) != string(b2) {
		t.Fatalf("round trip changed the policy:\n%s\n%s", b, b2)
	}
	if _, lossless := ToNetworkPolicy(q); lossless {
		t.Fatal("ToNetworkPolicy calls a policy with http rules lossless")
	}
	c := q.Clone()
	c.Egress[0].HTTP.Rules[0].Methods[0] = "X"
	if q.Egress[0].HTTP.Rules[0].Methods[0] != "DELETE" {
		t.Fatal("Clone shares the http rules")
	}
}

// TestHTTPExplain lists every rule with whether it matches.
func TestHTTPExplain(t *testing.T) {
	h := httpHost(t, githubLike, "api.github.test")
	dec, ms := h.Explain(HTTPRequest{Method: "DELETE", EscapedPath: "/repos/a"})
	if dec.Rule != "egress[0].http.rules[0]" || len(ms) != 5 {
		t.Fatalf("%+v %+v", dec, ms)
	}
	var matched []string
	for _, m := range ms {
		if m.Matches {
			matched = append(matched, m.Rule)
		}
	}
	if !slices.Equal(matched, []string{"egress[0].http.rules[0]"}) {
		t.Fatalf("matched %v", matched)
	}
}

func TestGlobMatch(t *testing.T) {
	cases := []struct {
		pat, path string
		want      bool
	}{
		{"/**/info/refs", "/a/b.git/info/refs", true},
		{"/**/info/refs", "/info/refs", true},
		{"/**/info/refs", "/a/info/refs/x", false},
		{"/a/*/c", "/a/b/c", true},
		{"/a/*/c", "/a/b/x/c", false},
		{"/a/*.json", "/a/x.json", true},
		{"/a/*.json", "/a/x.jsonx", false},
		{"/a/**", "/a/b/c", true},
		{"/a/b*d/e", "/a/bxyzd/e", true},
	}
	for _, c := range cases {
		if got := globMatch(strings.Split(c.pat[1:], "/"), c.path[1:]); got != c.want {
			t.Errorf("globMatch(%s, %s) = %t, want %t", c.pat, c.path, got, c.want)
		}
	}
}

// manyHTTPRules builds a policy with n HTTP rules on one host: exact paths, prefixes
// and a few globs, methods varied.
func manyHTTPRules(n int) string {
	var b strings.Builder
	b.WriteString("egress:\n  - action: allow\n    target: big.test\n    http:\n      rules:\n")
	methods := []string{"GET", "POST", "PUT", "DELETE"}
	for i := range n {
		path := fmt.Sprintf("/api/v%d/items/%d", i%7, i)
		switch i % 10 {
		case 1, 2, 3:
			path = fmt.Sprintf("/svc%d/*", i)
		case 4:
			if i%1000 == 4 {
				path = fmt.Sprintf("/g%d/**/x/*.json", i)
			}
		}
		fmt.Fprintf(&b, "        - {action: %s, methods: [%s], path: %q}\n", []string{"allow", "deny"}[i%2], methods[i%4], path)
	}
	return b.String()
}

// TestBenchHTTPRules measures compiling 10 000 HTTP rules and deciding a request
// against them (targets: compile ≤ 200 ms, decide ≤ 5 µs p99). It runs with
// AIRLOCK_BENCH=1 (make bench) and reports the figures.
func TestBenchHTTPRules(t *testing.T) {
	testenv.NeedBench(t)
	doc := []byte(manyHTTPRules(10000))
	start := time.Now()
	pol, err := Parse("big.yaml", doc)
	parse := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	d, err := Compile(pol, CompileOptions{Overlay: BaseOverlay()})
	compile := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	h := d.DecideName("big.test", 443, TCP).HTTP
	reqs := []HTTPRequest{
		{Method: "GET", EscapedPath: "/api/v0/items/9940"},
		{Method: "DELETE", EscapedPath: "/svc9993/a/b"},
		{Method: "PATCH", EscapedPath: "/nothing/matches/here"},
		{Method: "get", EscapedPath: "/g4/a/b/x/y.json"},
	}
	const n = 20000
	lat := make([]time.Duration, 0, n)
	for i := range n {
		q := reqs[i%len(reqs)]
		s := time.Now()
		h.Decide(q)
		lat = append(lat, time.Since(s))
	}
	slices.Sort(lat)
	p50, p99 := lat[n/2], lat[n*99/100]
	benchreport.Value("policies", "http rules, 10000 on one host", "parse %v, compile %v, decide p50 %v p99 %v", parse, compile, p50, p99)
	benchreport.Ratio("policies", "http rules compile (10000) / 200 ms target", float64(compile)/float64(200*time.Millisecond), "≤", 1)
	benchreport.Ratio("policies", "http rules decide p99 (10000) / 5 µs target", float64(p99)/float64(5*time.Microsecond), "≤", 1)
}
