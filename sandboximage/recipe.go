// Package sandboximage builds Airlock's sandbox images offline: debootstrap a minimal
// Debian root, install the recipe's packages with apt inside it, add npm packages (with
// the build host's npm) and Airlock's files, write Jupyter kernelspecs, and `docker
// import` the tree (docs/architecture.md#images). No container registry is needed. The
// image carries the recipe's hash as a label, so a build whose recipe has not changed is
// skipped.
//
// Four recipes ship: the default image (DefaultRecipe, airlock/sandbox), the code
// interpreter (CodeInterpreterRecipe, airlock/code-interpreter) with kernels for Python,
// JavaScript, TypeScript and Go, the browser (BrowserRecipe, airlock/browser): headless
// Chromium with the DevTools protocol on port 9222, and the desktop (DesktopRecipe,
// airlock/desktop): Xvfb, a window manager and Chromium over VNC and noVNC. See
// README.md.
package sandboximage

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
)

// Repository is the default image's name; tags are the Airlock version and "latest".
const Repository = "airlock/sandbox"

// CodeInterpreterRepository is the code-interpreter image's name.
const CodeInterpreterRepository = "airlock/code-interpreter"

// GoKernelPath is where the Go kernel binary (cmd/airlock-gokernel) lives in an image.
const GoKernelPath = "/usr/local/bin/airlock-gokernel"

// KernelDir is where a recipe's kernelspecs are written (a Jupyter data directory that
// execd searches).
const KernelDir = "/usr/local/share/jupyter/kernels"

// RecipeLabel is the image label holding the recipe hash.
const RecipeLabel = "airlock.dev/image-recipe"

//go:embed code-interpreter.sh
var codeInterpreterScript []byte

//go:embed browser.sh
var browserScript string

// BrowserRepository is the browser image's name.
const BrowserRepository = "airlock/browser"

// BrowserEntrypoint is the browser image's entrypoint script (browser.sh): headless
// Chromium with the DevTools protocol on BrowserCDPPort. A sandbox runs it when its
// create request names it as the entrypoint.
const BrowserEntrypoint = "/opt/airlock/browser.sh"

// BrowserCDPPort is the port of the Chrome DevTools Protocol (HTTP /json/* and its
// WebSockets) in a sandbox running BrowserEntrypoint.
const BrowserCDPPort = 9222

// Recipe is what an image is built from. Two recipes with the same Hash build the same
// image.
type Recipe struct {
	// Repository is the image name (tags: the version and latest). It names the image and
	// is not part of the hash.
	Repository string `json:"-"`
	// Suite is the Debian release (bookworm).
	Suite string `json:"suite"`
	// Mirror is the Debian mirror URL.
	Mirror string `json:"mirror"`
	// Security is the Debian security archive URL (http://deb.debian.org/debian-security);
	// when set, <Suite>-security is added before the packages are installed and the
	// whole root is upgraded from it, so the image has the security updates published
	// up to its build (a cached image keeps those of the day it was built: rebuild to
	// take newer ones). Empty: the suite's release packages only.
	Security string `json:"security,omitempty"`
	// Packages are installed with apt after debootstrap (recommends off).
	Packages []string `json:"packages"`
	// Env and Workdir become the image's config.
	Env     []string `json:"env"`
	Workdir string   `json:"workdir"`
	// Revision is bumped when the build steps change in a way the fields do not show.
	Revision int `json:"revision"`
	// NPM are npm packages (name@exact-version) installed globally under /usr/local with
	// the build host's npm from the npm registry; their native parts must come as
	// prebuilt binaries in the package tarballs (nothing is compiled or fetched from
	// elsewhere). Needs a Node.js runtime among Packages.
	NPM []string `json:"npm,omitempty"`
	// GoKernel copies the Go kernel binary (Builder.GoKernel) to GoKernelPath; its
	// content is part of the image's hash.
	GoKernel bool `json:"goKernel,omitempty"`
	// Kernels are written to KernelDir/<name>/kernel.json.
	Kernels []Kernelspec `json:"kernels,omitempty"`
	// Remove are paths in the root deleted before import (globs allowed), for what the
	// packages carry that the image never uses.
	Remove []string `json:"remove,omitempty"`
	// Verify is a bash script run in the finished root (chroot); a non-zero exit fails the
	// build.
	Verify string `json:"verify,omitempty"`
	// Files are executable files (mode 0755) written into the root: absolute path inside
	// the image → content. Their content is part of the hash.
	Files map[string]string `json:"files,omitempty"`
	// Expose are the TCP ports the image declares (EXPOSE <port>/tcp in its config).
	Expose []int `json:"expose,omitempty"`
}

// Kernelspec is a Jupyter kernelspec
// (https://jupyter-client.readthedocs.io/en/stable/kernels.html#kernel-specs).
type Kernelspec struct {
	// Name is the kernelspec's directory name.
	Name        string            `json:"name"`
	Argv        []string          `json:"argv"`
	DisplayName string            `json:"display_name"`
	Language    string            `json:"language"`
	Env         map[string]string `json:"env,omitempty"`
}

// DefaultRecipe is the default sandbox image: a shell, the usual tools, curl with CA
// certificates, and Python with a Jupyter kernel for code contexts.
func DefaultRecipe() Recipe {
	return Recipe{
		Repository: Repository,
		Suite:      "bookworm",
		Mirror:     "http://deb.debian.org/debian",
		Packages: []string{
			"bash", "coreutils", "grep", "sed", "findutils", "procps", "curl", "ca-certificates",
			"iproute2", "python3", "python3-ipykernel",
		},
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"LANG=C.UTF-8",
			"PYTHONUNBUFFERED=1",
		},
		Workdir:  "/workspace",
		Revision: 1,
	}
}

// CodeInterpreterRecipe is the code-interpreter image: the default image plus Node.js,
// and Jupyter kernels for every language execd's code contexts serve besides bash
// (which execd serves itself):
//
//   - python: ipykernel from Debian (kernelspec python3, from the package);
//   - javascript and typescript: tslab from the npm registry (kernelspecs jslab and
//     tslab), whose ZeroMQ binding (zeromq 6) ships prebuilt in its tarball;
//   - go: Airlock's gokernel (the yaegi interpreter; standard library only, no toolchain
//     and no network needed at run time).
//
// It also has git (Debian's, HTTPS through libcurl-gnutls, which trusts the system
// bundle /etc/ssl/certs/ca-certificates.crt that the sandbox's trust init fills), as
// OpenSandbox's code-interpreter image does: agents clone repositories, and the egress
// policy's `git: fetch` / `git: push` presets are tested with it (egressd).
//
// Java has no kernel: none can be had from Debian, the npm registry or the Go module
// proxy (IJava is published on GitHub only).
func CodeInterpreterRecipe() Recipe {
	r := DefaultRecipe()
	r.Repository = CodeInterpreterRepository
	r.Packages = append(r.Packages, "nodejs", "git")
	r.Env = append(r.Env, "NODE_PATH=/usr/local/lib/node_modules")
	r.NPM = []string{"tslab@1.0.22"}
	r.GoKernel = true
	tslab := "/usr/local/lib/node_modules/tslab/bin/tslab"
	r.Kernels = []Kernelspec{
		{Name: "tslab", DisplayName: "TypeScript", Language: "typescript",
			Argv: []string{tslab, "kernel", "--config-path", "{connection_file}"}},
		{Name: "jslab", DisplayName: "JavaScript", Language: "javascript",
			Argv: []string{tslab, "kernel", "--config-path", "{connection_file}", "--js"}},
		{Name: "go", DisplayName: "Go", Language: "go",
			Argv: []string{GoKernelPath, "{connection_file}"}},
	}
	// zeromq ships prebuilt addons for every platform; only linux/x64 glibc is used.
	zmq := "usr/local/lib/node_modules/tslab/node_modules/zeromq/build/"
	r.Remove = []string{zmq + "darwin", zmq + "win32", zmq + "linux/arm*", zmq + "linux/x64/node/musl-*"}
	r.Verify = `set -e
cd /usr/local/lib/node_modules/tslab && node -e 'require("zeromq")'
python3 -c 'import ipykernel'
git --version
test -x /usr/lib/git-core/git-remote-https
test -x ` + GoKernelPath + `
for k in ` + KernelDir + `/*/kernel.json /usr/share/jupyter/kernels/*/kernel.json; do
  test -x "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["argv"][0])' "$k")"
done`
	return r
}

// BrowserRecipe is the browser image: the default image plus Debian's Chromium, fonts
// (Liberation for the metric-compatible Arial/Times/Courier, DejaVu, Noto color emoji
// left out for size) and socat, with BrowserEntrypoint, which starts headless Chromium
// with remote debugging on BrowserCDPPort.
func BrowserRecipe() Recipe {
	r := DefaultRecipe()
	r.Repository = BrowserRepository
	r.Packages = append(r.Packages, "chromium", "fonts-liberation", "fonts-dejavu-core", "socat")
	// A browser parses whatever the sites it visits send: Chromium's security updates
	// are in bookworm-security, not in bookworm.
	r.Security = "http://deb.debian.org/debian-security"
	// /entrypoint is the entrypoint OpenSandbox's Chrome example names.
	r.Files = map[string]string{BrowserEntrypoint: browserScript,
		"/entrypoint": "#!/bin/sh\n# OpenSandbox's Chrome example names this entrypoint.\nexec " + BrowserEntrypoint + " \"$@\"\n"}
	// Locales and translations of Chromium's UI that a headless browser never shows.
	r.Remove = []string{"usr/share/locale/*", "usr/lib/chromium/locales/[a-df-z]*", "usr/lib/chromium/locales/e[a-mo-z]*"}
	// No /proc in the chroot: the chromium wrapper (which reads /proc/cpuinfo) is run in
	// the image's tests, here only its binary's dependencies are checked.
	r.Verify = `set -e
test -x /usr/lib/chromium/chromium
dpkg-query -W -f='${Status}\n' chromium | grep -q 'install ok installed'
socat -V >/dev/null
test -x ` + BrowserEntrypoint + `
ls /usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf
test -f /usr/lib/chromium/locales/en-US.pak`
	return r
}

// Recipes are the images `airlock image build NAME` knows, by name.
func Recipes() map[string]Recipe {
	return map[string]Recipe{"sandbox": DefaultRecipe(), "code-interpreter": CodeInterpreterRecipe(),
		"browser": BrowserRecipe(), "desktop": DesktopRecipe()}
}

var (
	suiteRe   = regexp.MustCompile(`^[a-z]+$`)
	packageRe = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	repoRe    = regexp.MustCompile(`^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$`)
	npmRe     = regexp.MustCompile(`^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*@[0-9]+\.[0-9]+\.[0-9]+[a-z0-9.+-]*$`)
	kernelRe  = regexp.MustCompile(`^[a-zA-Z0-9._-]+$`)
)

// Validate reports the first problem with r.
func (r Recipe) Validate() error {
	if !suiteRe.MatchString(r.Suite) {
		return fmt.Errorf("recipe: invalid suite %q", r.Suite)
	}
	if u, err := url.Parse(r.Mirror); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("recipe: invalid mirror %q: want http(s)://host/path", r.Mirror)
	}
	if u, err := url.Parse(r.Security); r.Security != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
		return fmt.Errorf("recipe: invalid security archive %q: want http(s)://host/path", r.Security)
	}
	if len(r.Packages) == 0 {
		return fmt.Errorf("recipe: no packages")
	}
	for _, p := range r.Packages {
		if !packageRe.MatchString(p) {
			return fmt.Errorf("recipe: invalid package name %q", p)
		}
	}
	if !repoRe.MatchString(r.Repository) {
		return fmt.Errorf("recipe: invalid repository %q", r.Repository)
	}
	for _, p := range r.NPM {
		if !npmRe.MatchString(p) {
			return fmt.Errorf("recipe: invalid npm package %q: want name@exact-version", p)
		}
	}
	for _, k := range r.Kernels {
		if !kernelRe.MatchString(k.Name) || len(k.Argv) == 0 || k.Language == "" {
			return fmt.Errorf("recipe: kernelspec %q needs a plain name, argv and a language", k.Name)
		}
	}
	for p := range r.Files {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return fmt.Errorf("recipe: invalid file path %q: want a clean absolute path", p)
		}
	}
	for _, p := range r.Expose {
		if p < 1 || p > 65535 {
			return fmt.Errorf("recipe: invalid exposed port %d", p)
		}
	}
	for _, p := range r.Remove {
		if p == "" || filepath.IsAbs(p) || strings.Contains(p, "..") {
			return fmt.Errorf("recipe: invalid remove path %q: want a relative path inside the root", p)
		}
	}
	return nil
}

// Hash identifies the recipe and Airlock's files in the image (hex SHA-256, 16 chars).
// For a recipe with GoKernel the image's hash also covers the kernel binary: see
// ImageHash.
func (r Recipe) Hash() string {
	return r.ImageHash(nil)
}

// ImageHash is the label of the image built from r with goKernel as the Go kernel binary
// (ignored unless r.GoKernel).
func (r Recipe) ImageHash(goKernel []byte) string {
	h := sha256.New()
	_ = json.NewEncoder(h).Encode(r)
	h.Write(codeInterpreterScript)
	if r.GoKernel {
		k := sha256.Sum256(goKernel)
		h.Write(k[:])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
