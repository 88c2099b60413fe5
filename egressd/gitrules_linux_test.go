package egressd

import (
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/cgi"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/egressd/datapath/datapathtest"
	"github.com/airlockdev/airlock/egressd/vault"
	"github.com/airlockdev/airlock/internal/dnstest"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/sdk"
)

// gitIP serves git.test: git's smart HTTP (`git http-backend`) over HTTPS with a
// certificate from the test's own CA.
var gitIP = netip.MustParseAddr("203.0.113.40")

// gitServer is git.test: a bare repository on the host served by `git http-backend`
// (CGI, through net/http/cgi) on gitIP:443 in the internet namespace. It records the
// smart-HTTP service of every request it is asked.
type gitServer struct {
	bare  string // the bare repository (…/repo.git), served as /repo.git
	caPEM []byte // the CA of its certificate

	mu       sync.Mutex
	services []string // "GET git-upload-pack", "POST git-receive-pack", …
}

// hostGit runs git on the host (dir "": the current directory) and returns its
// trimmed output; it fails the test when git fails.
func hostGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=host", "-c", "user.email=host@git.test",
		"-c", "init.defaultBranch=main"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// newGitServer creates the bare repository with one commit (README: "seed") and serves
// it. Receive-pack is on (http.receivepack): only the egress policy stands between the
// sandbox and a push.
func (w *world) newGitServer(t *testing.T) *gitServer {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		testenv.SkipOrFail(t, "git is missing on the host (deploy/host/prepare.sh installs it)")
	}
	dir := t.TempDir()
	g := &gitServer{bare: filepath.Join(dir, "repo.git")}
	hostGit(t, dir, "init", "-q", "--bare", g.bare)
	hostGit(t, g.bare, "config", "http.receivepack", "true")
	work := filepath.Join(dir, "work")
	hostGit(t, dir, "init", "-q", work)
	if err := os.WriteFile(filepath.Join(work, "README"), []byte("seed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hostGit(t, work, "add", "README")
	hostGit(t, work, "commit", "-qm", "seed")
	hostGit(t, work, "push", "-q", g.bare, "HEAD:refs/heads/main")
	backend := &cgi.Handler{Path: filepath.Join(hostGit(t, "", "--exec-path"), "git-http-backend"),
		Env: []string{"GIT_PROJECT_ROOT=" + dir, "GIT_HTTP_EXPORT_ALL=1"}, InheritEnv: []string{"PATH"}}
	h := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		svc := r.URL.Query().Get("service")
		if svc == "" {
			svc = filepath.Base(r.URL.Path)
		}
		g.mu.Lock()
		g.services = append(g.services, r.Method+" "+svc)
		g.mu.Unlock()
		backend.ServeHTTP(rw, r)
	})
	datapathtest.IP(t, "-n", w.ns.Name, "addr", "add", gitIP.String()+"/32", "dev", "lo")
	var cert tls.Certificate
	cert, g.caPEM = testServerCert(t, "git.test")
	l, err := w.ns.Listen("tcp", gitIP.String()+":443")
	if err != nil {
		t.Fatal(err)
	}
	l = tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{cert}})
	t.Cleanup(func() { l.Close() })
	go http.Serve(l, h)
	return g
}

// asked reports whether the server was asked for service (git-upload-pack,
// git-receive-pack) in any request.
func (g *gitServer) asked(service string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, s := range g.services {
		if strings.HasSuffix(s, " "+service) {
			return true
		}
	}
	return false
}

// head is the commit of the bare repository's main branch.
func (g *gitServer) head(t *testing.T) string {
	return hostGit(t, g.bare, "rev-parse", "refs/heads/main")
}

// recvDataRe finds the pieces of received bodies in a GIT_TRACE_CURL trace: git
// prints them in lines of up to 60 bytes, "<= Recv data: {…", with "." for a newline.
var recvDataRe = regexp.MustCompile(`(?m)<= Recv data: (.*)$`)

// deniedBody is the first EGRESS_DENIED body received in a GIT_TRACE_CURL trace.
func deniedBody(trace string) httpDenied {
	var b strings.Builder
	for _, m := range recvDataRe.FindAllStringSubmatch(trace, -1) {
		b.WriteString(m[1])
	}
	all := b.String()
	var d httpDenied
	if i := strings.Index(all, `{"code":"EGRESS_DENIED"`); i >= 0 {
		json.NewDecoder(strings.NewReader(all[i:])).Decode(&d)
	}
	return d
}

// TestEgressdGitHTTPRules is issue 27's "read-only GitHub" with real git: a sandbox of
// the code-interpreter image (which has Debian's git) whose policy gives git.test
// `git: [fetch]` clones and fetches through egressd's interception (git trusts the
// sandbox's CA), and its `git push` is refused with 403 and the JSON body naming the
// rule, before git-receive-pack is ever asked; once the policy adds `push`, the same push
// lands in the bare repository on the host. Every request is audited with its rule. On
// each datapath.
func TestEgressdGitHTTPRules(t *testing.T) {
	store, err := vault.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, func(o *lctest.Options) { o.CredentialVault = store })
	w.h.Image = testenv.NeedCodeInterpreterImage(t)
	g := w.newGitServer(t)
	w.upstream = dnstest.Serve(t, dnstest.Zone(map[string]netip.Addr{"git.test.": gitIP}, 300))
	policy := func(git ...string) string {
		b, _ := json.Marshal(git)
		return `{"defaultAction":"deny","egress":[{"action":"allow","target":"git.test","http":{"git":` + string(b) + `}}]}`
	}
	run := func(t *testing.T, x *sdk.Execd, cmd string) (int, string) {
		t.Helper()
		return sh(t, x, "exec 2>&1; "+cmd)
	}
	audited := func(t *testing.T, id, what, action, rule, method, path string) {
		t.Helper()
		w.waitAudit(t, id, what, func(r audit.Record) bool {
			return r.Source == audit.SourceL7 && r.Action == action && r.Rule == rule && r.Proto == "https" &&
				r.DstHost == "git.test" && r.Extra["method"] == method && r.Extra["path"] == path
		})
	}
	const commit = `git -c user.name=agent -c user.email=agent@sandbox.test commit -qm`
	w.eachBackend(t, policy("fetch"), func(t *testing.T, d *Daemon, sb *sdk.Sandbox, x *sdk.Execd) {
		g.mu.Lock()
		g.services = nil // the other datapath's run pushed
		g.mu.Unlock()
		repo := "/tmp/repo-" + sb.ID
		// Clone, through the interception: git (libcurl-gnutls) trusts the sandbox's CA
		// by GIT_SSL_CAINFO and, without it, by the system store lifecycle filled.
		if code, out := run(t, x, "test -n \"$GIT_SSL_CAINFO\" && git clone -q https://git.test/repo.git "+repo+" && cat "+repo+"/README"); code != 0 || out != "seed" {
			t.Fatalf("git clone = %d %q, want the seed commit", code, out)
		}
		if code, out := run(t, x, "env -u GIT_SSL_CAINFO git ls-remote https://git.test/repo.git main"); code != 0 || !strings.HasSuffix(out, "refs/heads/main") {
			t.Errorf("git ls-remote with the system store only = %d %q", code, out)
		}
		// Where the system store lacks the CA (on Kubernetes the bundle is execd's), git
		// reads GIT_SSL_CAINFO, and fails without it.
		noStore := "mkdir -p /tmp/empty-store && GIT_SSL_CAPATH=/tmp/empty-store "
		if code, out := run(t, x, noStore+"git ls-remote https://git.test/repo.git main"); code != 0 || !strings.HasSuffix(out, "refs/heads/main") {
			t.Errorf("git ls-remote with GIT_SSL_CAINFO only = %d %q", code, out)
		}
		if code, out := run(t, x, noStore+"env -u GIT_SSL_CAINFO git ls-remote https://git.test/repo.git main"); code == 0 || !strings.Contains(out, "certificate") {
			t.Errorf("git ls-remote with neither GIT_SSL_CAINFO nor the system store = %d %q, want a certificate error", code, out)
		} else {
			t.Logf("without the CA: %s", out)
		}
		audited(t, sb.ID, "info/refs of upload-pack allowed", "allow", "egress[0].http.git.fetch", "GET", "/repo.git/info/refs")
		audited(t, sb.ID, "upload-pack allowed", "allow", "egress[0].http.git.fetch", "POST", "/repo.git/git-upload-pack")

		// A commit made on the host arrives by git fetch.
		work := t.TempDir()
		hostGit(t, "", "clone", "-q", g.bare, work)
		if err := os.WriteFile(filepath.Join(work, "HOST"), []byte(time.Now().String()), 0o644); err != nil {
			t.Fatal(err)
		}
		hostGit(t, work, "add", "HOST")
		hostGit(t, work, "commit", "-qm", "from the host")
		hostGit(t, work, "push", "-q", "origin", "HEAD:main")
		if code, out := run(t, x, "cd "+repo+" && git fetch -q origin && git rev-parse origin/main"); code != 0 || out != g.head(t) {
			t.Errorf("git fetch = %d %q, want origin/main at %s", code, out, g.head(t))
		}

		// Push is refused by the host's default: git prints the 403; the body names the rule.
		before := g.head(t)
		code, out := run(t, x, "cd "+repo+" && git reset -q --hard origin/main && echo "+sb.ID+" > AGENT && git add AGENT && "+commit+" agent && "+
			"GIT_TRACE_CURL=/tmp/trace-"+sb.ID+" git push origin HEAD:main")
		if code == 0 || !strings.Contains(out, "403") {
			t.Errorf("git push under git: [fetch] = %d %q, want a failure naming HTTP 403", code, out)
		}
		t.Logf("git push under git: [fetch]: exit %d: %s", code, out)
		_, trace := sh(t, x, "cat /tmp/trace-"+sb.ID)
		if denied := deniedBody(trace); denied.Code != "EGRESS_DENIED" || denied.Rule != "egress[0].http.default" || !strings.Contains(denied.Message, "/repo.git/info/refs") {
			t.Errorf("the 403 git received = %+v, want EGRESS_DENIED naming egress[0].http.default (trace:\n%s)", denied, trace)
		}
		if g.asked("git-receive-pack") {
			t.Errorf("the server was asked for git-receive-pack under git: [fetch]")
		}
		if h := g.head(t); h != before {
			t.Errorf("the bare repository's main moved from %s to %s under git: [fetch]", before, h)
		}
		audited(t, sb.ID, "info/refs of receive-pack denied", "deny", "egress[0].http.default", "GET", "/repo.git/info/refs")

		// With push added, the same push lands in the bare repository on the host.
		w.putPolicy(t, sb.ID, policy("fetch", "push"))
		code, out = run(t, x, "cd "+repo+" && git push -q origin HEAD:main && git rev-parse HEAD")
		if code != 0 || out != g.head(t) {
			t.Errorf("git push under git: [fetch, push] = %d %q, want the host's main (%s) at the pushed commit", code, out, g.head(t))
		}
		audited(t, sb.ID, "info/refs of receive-pack allowed", "allow", "egress[0].http.git.push", "GET", "/repo.git/info/refs")
		audited(t, sb.ID, "receive-pack allowed", "allow", "egress[0].http.git.push", "POST", "/repo.git/git-receive-pack")
		if _, out := sh(t, x, "cd "+repo+" && git show -s --format=%s origin/main"); out != "agent" {
			t.Errorf("origin/main after the push = %q, want the agent's commit", out)
		}
	}, func(c *Config) { c.L7Port = 15001; c.Vault = store; c.UpstreamCAPEM = g.caPEM })
}
