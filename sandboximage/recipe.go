// Package sandboximage builds Airlock's default sandbox image offline from Debian
// packages: debootstrap a minimal root, install the recipe's packages with apt inside it,
// add Airlock's files, and `docker import` the tree (DESIGN.md §7). No container registry
// is needed. The image carries the recipe's hash as a label, so a build whose recipe has
// not changed is skipped.
package sandboximage

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
)

// Repository is the default image's name; tags are the Airlock version and "latest".
const Repository = "airlock/sandbox"

// RecipeLabel is the image label holding the recipe hash.
const RecipeLabel = "airlock.dev/image-recipe"

//go:embed code-interpreter.sh
var codeInterpreterScript []byte

// Recipe is what an image is built from. Two recipes with the same Hash build the same
// image.
type Recipe struct {
	// Suite is the Debian release (bookworm).
	Suite string `json:"suite"`
	// Mirror is the Debian mirror URL.
	Mirror string `json:"mirror"`
	// Packages are installed with apt after debootstrap (recommends off).
	Packages []string `json:"packages"`
	// Env and Workdir become the image's config.
	Env     []string `json:"env"`
	Workdir string   `json:"workdir"`
	// Revision is bumped when the build steps change in a way the fields do not show.
	Revision int `json:"revision"`
}

// DefaultRecipe is the default sandbox image: a shell, the usual tools, curl with CA
// certificates, and Python with a Jupyter kernel for code contexts.
func DefaultRecipe() Recipe {
	return Recipe{
		Suite:  "bookworm",
		Mirror: "http://deb.debian.org/debian",
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

var (
	suiteRe   = regexp.MustCompile(`^[a-z]+$`)
	packageRe = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
)

// Validate reports the first problem with r.
func (r Recipe) Validate() error {
	if !suiteRe.MatchString(r.Suite) {
		return fmt.Errorf("recipe: invalid suite %q", r.Suite)
	}
	if u, err := url.Parse(r.Mirror); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("recipe: invalid mirror %q: want http(s)://host/path", r.Mirror)
	}
	if len(r.Packages) == 0 {
		return fmt.Errorf("recipe: no packages")
	}
	for _, p := range r.Packages {
		if !packageRe.MatchString(p) {
			return fmt.Errorf("recipe: invalid package name %q", p)
		}
	}
	return nil
}

// Hash identifies the recipe and Airlock's files in the image (hex SHA-256, 16 chars).
func (r Recipe) Hash() string {
	h := sha256.New()
	_ = json.NewEncoder(h).Encode(r)
	h.Write(codeInterpreterScript)
	return hex.EncodeToString(h.Sum(nil))[:16]
}
