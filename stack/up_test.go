package stack

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadConfigStrict(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", "listen: 127.0.0.1:9999\nlifecycle:\n  maxTimeout: 2h\ndocker:\n  network: airlock9\n  allowedHostRoots: [/srv]\n")
	c, err := LoadConfig(good, false)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:9999" || time.Duration(c.Lifecycle.MaxTimeout) != 2*time.Hour || c.Docker.Network != "airlock9" || c.Docker.AllowedHostRoots[0] != "/srv" {
		t.Errorf("parsed %+v", c)
	}
	for name, body := range map[string]string{
		"unknown_top":    "listen: x\nlisten_port: 1\n",
		"unknown_nested": "docker:\n  netwrk: x\n",
		"bad_duration":   "lifecycle:\n  maxTimeout: forever\n",
		"wrong_type":     "noAuth: maybe\n",
	} {
		if _, err := LoadConfig(write(name+".yaml", body), false); err == nil {
			t.Errorf("%s: accepted", name)
		} else if !strings.Contains(err.Error(), "line") {
			t.Errorf("%s: error without a line number: %v", name, err)
		}
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.yaml"), false); err == nil {
		t.Errorf("missing explicit config accepted")
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.yaml"), true); err != nil {
		t.Errorf("missing optional config: %v", err)
	}
	bad := Config{Docker: DockerConfig{Subnet: "10.0.0.0/99"}}
	if err := bad.setDefaults(); err == nil {
		t.Errorf("bad subnet accepted")
	}
	for rt, want := range map[string]string{"kubernetes": "airlock lifecycle", "podman": "want docker or kubernetes"} {
		c := Config{Runtime: rt}
		if err := c.setDefaults(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("runtime %s: %v, want an error saying %q", rt, err, want)
		}
	}
	if c := (Config{}); c.setDefaults() != nil || c.Runtime != "docker" {
		t.Errorf("default runtime %q", c.Runtime)
	}
}

func TestAPIKeyGeneratedStoredReused(t *testing.T) {
	dir := t.TempDir()
	s := &Stack{cfg: Config{StateDir: dir}}
	k1, err := s.apiKey()
	if err != nil || len(k1) < 32 {
		t.Fatalf("key %q %v", k1, err)
	}
	fi, err := os.Stat(filepath.Join(dir, "api-key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("stored key: %v %v", fi, err)
	}
	k2, _ := s.apiKey()
	if k2 != k1 {
		t.Errorf("key not reused: %q then %q", k1, k2)
	}
	s.cfg.NoAuth = true
	if k, _ := s.apiKey(); k != "" {
		t.Errorf("--no-auth still has key %q", k)
	}
	s.cfg = Config{StateDir: dir, APIKey: "explicit"}
	if k, _ := s.apiKey(); k != "explicit" {
		t.Errorf("configured key ignored: %q", k)
	}
}

func TestGatewayDefaultAccess(t *testing.T) {
	c := Config{}
	if err := c.setDefaults(); err != nil || c.Gateway.DefaultAccess != "public" {
		t.Fatalf("default: %q %v", c.Gateway.DefaultAccess, err)
	}
	c = Config{Gateway: GatewayConfig{DefaultAccess: "token"}}
	if err := c.setDefaults(); err != nil || c.Gateway.DefaultAccess != "token" {
		t.Fatalf("token: %q %v", c.Gateway.DefaultAccess, err)
	}
	for _, bad := range []string{"signed", "Token", "private"} {
		c = Config{Gateway: GatewayConfig{DefaultAccess: bad}}
		if err := c.setDefaults(); err == nil {
			t.Errorf("defaultAccess %q accepted", bad)
		}
	}
}

func TestEgressNFTTable(t *testing.T) {
	c := Config{}
	if err := c.setDefaults(); err != nil || c.Egress.NFTTable != "airlock" {
		t.Fatalf("default nftTable %q %v", c.Egress.NFTTable, err)
	}
	c = Config{Egress: EgressdConfig{NFTTable: "airlock_b"}}
	if err := c.setDefaults(); err != nil || c.Egress.NFTTable != "airlock_b" {
		t.Fatalf("nftTable %q %v", c.Egress.NFTTable, err)
	}
	for _, bad := range []string{"2nd", "air lock", "a;b"} {
		c = Config{Egress: EgressdConfig{NFTTable: bad}}
		if err := c.setDefaults(); err == nil || !strings.Contains(err.Error(), "egress.nftTable") {
			t.Errorf("nftTable %q: %v, want an error naming egress.nftTable", bad, err)
		}
	}
}

// TestDockerRuntimeKey: docker.runtime is the engine runtime of every sandbox; the
// former key ociRuntime is refused with a pointer to it.
func TestDockerRuntimeKey(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "gvisor.yaml")
	if err := os.WriteFile(p, []byte("docker:\n  runtime: runsc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(p, false)
	if err != nil {
		t.Fatal(err)
	}
	if c.Docker.Runtime != "runsc" {
		t.Errorf("docker.runtime = %q", c.Docker.Runtime)
	}
	if err := c.setDefaults(); err != nil {
		t.Errorf("docker.runtime: runsc refused: %v", err)
	}
	old := Config{Docker: DockerConfig{OCIRuntime: "runsc"}}
	if err := old.setDefaults(); err == nil || !strings.Contains(err.Error(), "docker.runtime") {
		t.Errorf("docker.ociRuntime: %v, want a pointer to docker.runtime", err)
	}
}
