package sandboximage

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/testenv"
)

func TestRecipeValidate(t *testing.T) {
	good := DefaultRecipe()
	if err := good.Validate(); err != nil {
		t.Fatalf("default recipe invalid: %v", err)
	}
	cases := map[string]func(*Recipe){
		"bad_suite":   func(r *Recipe) { r.Suite = "bookworm; rm -rf /" },
		"bad_mirror":  func(r *Recipe) { r.Mirror = "deb.debian.org" },
		"no_packages": func(r *Recipe) { r.Packages = nil },
		"bad_package": func(r *Recipe) { r.Packages = []string{"curl", "--allow-unauthenticated"} },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			r := DefaultRecipe()
			mutate(&r)
			if err := r.Validate(); err == nil {
				t.Errorf("Validate accepted %+v", r)
			}
		})
	}
}

func TestRecipeHashChangesWithRecipe(t *testing.T) {
	a, b := DefaultRecipe(), DefaultRecipe()
	if a.Hash() != b.Hash() {
		t.Fatal("same recipe, different hashes")
	}
	b.Packages = append(b.Packages, "nodejs")
	if a.Hash() == b.Hash() {
		t.Error("adding a package did not change the hash")
	}
	c := DefaultRecipe()
	c.Revision++
	if a.Hash() == c.Hash() {
		t.Error("bumping the revision did not change the hash")
	}
}

// TestDefaultImageContents checks the built image carries what sandboxes and OpenSandbox
// clients rely on, and the label that makes the build cache work.
func TestDefaultImageContents(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	label, err := exec.CommandContext(ctx, "docker", "image", "inspect", "--format",
		`{{index .Config.Labels "`+RecipeLabel+`"}}`, img).Output()
	if err != nil {
		t.Fatalf("inspect %s: %v", img, err)
	}
	if got := strings.TrimSpace(string(label)); got != DefaultRecipe().Hash() {
		t.Errorf("image recipe label = %q, want %q (stale image: run make image)", got, DefaultRecipe().Hash())
	}

	script := `set -e
id -u nobody; getent group nogroup >/dev/null && echo nogroup
test -x /opt/code-interpreter/code-interpreter.sh && echo ci
test -d /workspace && pwd
python3 -c 'import ipykernel; print("ipykernel")'
test -f /usr/share/jupyter/kernels/python3/kernel.json && echo kernelspec
curl --version >/dev/null && echo curl
ps -o pid= -p 1 >/dev/null && echo procps`
	out, err := exec.CommandContext(ctx, "docker", "run", "--rm", "--network", "none", img, "bash", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("docker run: %v\n%s", err, out)
	}
	want := []string{"65534", "nogroup", "ci", "/workspace", "ipykernel", "kernelspec", "curl", "procps"}
	got := strings.Fields(string(out))
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("image contents:\n got %v\nwant %v", got, want)
	}
}

// TestCodeInterpreterImageContents checks the code-interpreter image carries a kernelspec
// whose program exists for every language, the recipe label, Node.js with tslab's
// ZeroMQ binding loadable, and git with its HTTPS transport.
func TestCodeInterpreterImageContents(t *testing.T) {
	img := testenv.NeedCodeInterpreterImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	label, err := exec.CommandContext(ctx, "docker", "image", "inspect", "--format",
		`{{index .Config.Labels "`+RecipeLabel+`"}}`, img).Output()
	if err != nil {
		t.Fatalf("inspect %s: %v", img, err)
	}
	if len(strings.TrimSpace(string(label))) != 16 {
		t.Errorf("image recipe label = %q, want a 16-digit hash", label)
	}
	script := `set -e
for k in /usr/local/share/jupyter/kernels/*/kernel.json /usr/share/jupyter/kernels/*/kernel.json; do
  python3 -c 'import json,os,sys; s=json.load(open(sys.argv[1])); assert os.access(s["argv"][0], os.X_OK), s; print(s["language"])' "$k"
done | sort | tr '\n' ' '
cd /usr/local/lib/node_modules/tslab && node -e 'require("zeromq"); console.log("zeromq")'
test -x /opt/code-interpreter/code-interpreter.sh && echo ci
git --version | cut -d' ' -f1,2
test -x "$(git --exec-path)/git-remote-https" && echo https`
	out, err := exec.CommandContext(ctx, "docker", "run", "--rm", "--network", "none", img, "bash", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("docker run: %v\n%s", err, out)
	}
	want := "go javascript python typescript zeromq ci git version https"
	if got := strings.Join(strings.Fields(string(out)), " "); got != want {
		t.Errorf("image contents:\n got %s\nwant %s", got, want)
	}
}

func TestCodeInterpreterRecipe(t *testing.T) {
	r := CodeInterpreterRecipe()
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	if r.ImageHash([]byte("kernel a")) == r.ImageHash([]byte("kernel b")) {
		t.Error("a different Go kernel binary did not change the image hash")
	}
	if d := DefaultRecipe(); d.ImageHash([]byte("x")) != d.Hash() {
		t.Error("the default recipe's hash depends on a Go kernel it does not carry")
	}
	bad := r
	bad.NPM = []string{"tslab@latest"}
	if bad.Validate() == nil {
		t.Error("an npm package without an exact version was accepted")
	}
	bad = r
	bad.Remove = []string{"../etc"}
	if bad.Validate() == nil {
		t.Error("a remove path leaving the root was accepted")
	}
}

// TestBrowserImageContents checks the browser image carries the recipe label, Chromium
// (runnable: the Debian wrapper checks the CPU, so this runs in a container), socat and
// the entrypoint, and that the entrypoint serves the DevTools protocol on port 9222 of
// the container's address (Chromium itself only listens on loopback).
func TestBrowserImageContents(t *testing.T) {
	img := testenv.NeedBrowserImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	label, err := exec.CommandContext(ctx, "docker", "image", "inspect", "--format",
		`{{index .Config.Labels "`+RecipeLabel+`"}}`, img).Output()
	if err != nil {
		t.Fatalf("inspect %s: %v", img, err)
	}
	if got := strings.TrimSpace(string(label)); got != BrowserRecipe().Hash() {
		t.Errorf("image recipe label = %q, want %q (stale image: run make image)", got, BrowserRecipe().Hash())
	}
	// The entrypoint in the background, then /json/version on the container's own
	// address (eth0 of a bridge network), with that address as Host as the gateway sends.
	script := `set -e
chromium --version | grep -o '^Chromium [0-9]*' | cut -d' ' -f1
` + BrowserEntrypoint + ` >/tmp/browser.log 2>&1 &
ip=$(hostname -i | cut -d' ' -f1)
for i in $(seq 100); do
  if out=$(curl -sf -H "Host: $ip:9222" http://$ip:9222/json/version); then break; fi
  sleep 0.1
done
echo "$out" | python3 -c 'import json,sys; v=json.load(sys.stdin); print(v["webSocketDebuggerUrl"].split("/devtools/")[1].split("/")[0])'
ss -ltn | grep -c '127.0.0.1:9223'`
	out, err := exec.CommandContext(ctx, "docker", "run", "--rm", "--shm-size", "256m", img, "bash", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("docker run: %v\n%s", err, out)
	}
	want := "Chromium browser 1"
	if got := strings.Join(strings.Fields(string(out)), " "); got != want {
		t.Errorf("image contents:\n got %s\nwant %s", got, want)
	}

	checkSecurityArchive(t, ctx, img)
}

// checkSecurityArchive checks img has bookworm-security among its apt sources and, when
// this host's apt has a security archive too, that its chromium is the newest this
// host's apt offers.
func checkSecurityArchive(t *testing.T, ctx context.Context, img string) {
	t.Helper()
	sec, err := exec.CommandContext(ctx, "docker", "run", "--rm", img, "bash", "-c",
		`cat /etc/apt/sources.list.d/security.list; dpkg-query -W -f='${Version}' chromium`).CombinedOutput()
	if err != nil || !strings.Contains(string(sec), "bookworm-security") {
		t.Fatalf("image %s has no security archive: %v\n%s", img, err, sec)
	}
	policy, err := exec.CommandContext(ctx, "apt-cache", "policy", "chromium").Output()
	if err != nil || !strings.Contains(string(policy), "-security") {
		t.Logf("this host's apt has no security archive for chromium (%v); the version is not compared", err)
		return
	}
	for _, l := range strings.Split(string(policy), "\n") {
		if cand, ok := strings.CutPrefix(strings.TrimSpace(l), "Candidate: "); ok && !strings.HasSuffix(strings.TrimSpace(string(sec)), cand) {
			t.Errorf("image %s has chromium %q, this host's apt offers %s (with its security updates)",
				img, strings.TrimSpace(string(sec)[strings.LastIndex(string(sec), "\n")+1:]), cand)
		}
	}
}

func TestBrowserRecipe(t *testing.T) {
	r := BrowserRecipe()
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, ok := Recipes()["browser"]; !ok {
		t.Error("`airlock image build browser` does not know the recipe")
	}
	c := BrowserRecipe()
	c.Files = map[string]string{BrowserEntrypoint: "#!/bin/sh\n"}
	if c.Hash() == r.Hash() {
		t.Error("a different entrypoint script did not change the hash")
	}
	c.Files = map[string]string{"relative/path": ""}
	if c.Validate() == nil {
		t.Error("a relative file path was accepted")
	}
}
