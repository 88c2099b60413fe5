package sdk_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// sdkDeps are the only packages outside the standard library the Go SDK may import:
// the wire types it shares with the servers, each depending on the standard library
// only.
var sdkDeps = []string{
	"github.com/airlockdev/airlock/sdk",
	"github.com/airlockdev/airlock/opensandbox",
	"github.com/airlockdev/airlock/audit/record",
	"github.com/airlockdev/airlock/egressd/vault",
	"github.com/airlockdev/airlock/principal",
}

// TestLightDependencies: a program that imports the SDK builds only the standard
// library and Airlock's wire packages; no Prometheus, Caddy or Kubernetes client, which
// the servers use, comes along (go list -deps). It runs the go command, which needs
// no network with the module cache of a build.
func TestLightDependencies(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	cmd := exec.Command(goCmd, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")
	cmd.Env = append(os.Environ(), "GOPROXY=off") // never the network
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/airlockdev/airlock/sdk") {
		t.Fatalf("go list -deps did not list the sdk itself: %q", deps)
	}
	var heavy, other []string
	for _, d := range deps {
		switch {
		case strings.HasPrefix(d, "github.com/prometheus/"), strings.HasPrefix(d, "github.com/caddyserver/"),
			strings.HasPrefix(d, "k8s.io/"), strings.HasPrefix(d, "sigs.k8s.io/"):
			heavy = append(heavy, d)
		case !slices.Contains(sdkDeps, d):
			other = append(other, d)
		}
	}
	if len(heavy) > 0 {
		t.Errorf("the Go SDK pulls in server dependencies: %s", strings.Join(heavy, " "))
	}
	if len(other) > 0 {
		t.Errorf("the Go SDK imports %d packages besides the standard library and %v (move a shared wire type into a light package): %s",
			len(other), sdkDeps, strings.Join(other, " "))
	}
}
