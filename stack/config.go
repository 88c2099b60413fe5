package stack

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/airlockdev/airlock/policies/library"
	"github.com/airlockdev/airlock/sandboximage"
	"github.com/airlockdev/airlock/stack/doctor"
)

// DefaultConfigPath is read when no --config is given; a missing file there is fine.
const DefaultConfigPath = "/etc/airlock/airlock.yaml"

// Defaults of Config.StateDir and Config.Listen.
const (
	DefaultStateDir = "/var/lib/airlock"
	DefaultListen   = "127.0.0.1:8080"
)

// DefaultConfig is the configuration before airlock.yaml and the flags fill it: the
// components' defaults (DefaultGatewayConfig, DefaultEgressdConfig,
// DefaultAuditConfig). Settings that depend on others (the state directory's files,
// the Docker network) are filled by Resolved.
func DefaultConfig() Config {
	return Config{Gateway: DefaultGatewayConfig(), Egress: DefaultEgressdConfig(), Audit: DefaultAuditConfig()}
}

// Duration is a time.Duration written as a string in YAML ("30s", "24h").
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (examples: 30s, 24h)", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

// Config is the configuration of `airlock up` (/etc/airlock/airlock.yaml). Unknown keys
// are errors. Example:
//
//	listen: 127.0.0.1:8080
//	stateDir: /var/lib/airlock
//	lifecycle:
//	  maxTimeout: 24h
//	  maxSignedURLLifetime: 24h           # longest ?expires= of a signed endpoint
//	gateway:
//	  listen: 127.0.0.1:8081
//	  baseDomain: sandboxes.example.com   # host-form endpoints; empty: path form
//	  defaultAccess: public               # or token; execd and the egress API: always token
//	audit:
//	  dir: /var/lib/airlock/audit
//	  ocsf: {disabled: false}             # OCSF JSON Lines in <dir>/ocsf (on by default)
//	egress:
//	  mode: auto                          # auto | ebpf | nftables
//	  upstreams: [192.0.2.53]             # default: the host's /etc/resolv.conf
//	docker:
//	  network: airlock0
//	  subnet: 10.213.0.0/16
//	  runtime: runsc                      # gVisor for every sandbox (lifecycle/docker/README.md#gvisor)
//	  allowedHostRoots: [/srv/airlock]
//	images:
//	  aliases: {"opensandbox/code-interpreter:latest": "airlock/code-interpreter:latest"}
//	pools:
//	  - image: airlock/sandbox:latest
//	    size: 4
//	    resourceLimits: {cpu: "1", memory: 2Gi}
type Config struct {
	// Runtime runs the sandboxes: docker (the default, this host). kubernetes is the
	// cluster's control plane, which 'airlock lifecycle' runs (deploy/kubernetes): airlock
	// up refuses it with that pointer.
	Runtime string `yaml:"runtime"`
	// Listen is the lifecycle API's address; default DefaultListen (127.0.0.1:8080).
	Listen string `yaml:"listen"`
	// PublicAddr is the host[:port] clients use to reach the API, used in endpoints;
	// default: the Host the client used.
	PublicAddr string `yaml:"publicAddr"`
	// StateDir holds the store (lifecycle.db), the generated API key (api-key), the
	// signed-route key, the execd key (execd-key: every sandbox's execd token derives
	// from it) and, by default, the audit log and its signing key; default
	// DefaultStateDir (/var/lib/airlock).
	StateDir string `yaml:"stateDir"`
	// APIKey, when set, is the API key; otherwise one is generated on first start and
	// stored in StateDir/api-key. NoAuth turns authentication off.
	APIKey string `yaml:"apiKey"`
	NoAuth bool   `yaml:"noAuth"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel  string          `yaml:"logLevel"`
	Lifecycle LifecycleConfig `yaml:"lifecycle"`
	// Gateway configures the ingress gateway (see GatewayConfig; the same settings as
	// `airlock gateway`'s flags).
	Gateway GatewayConfig `yaml:"gateway"`
	// Audit is the hash-chained, signed audit log every component writes to; its Dir
	// defaults to <stateDir>/audit.
	Audit AuditConfig `yaml:"audit"`
	// Egress configures egressd (see EgressdConfig; the same settings as `airlock
	// egressd`'s flags).
	Egress  EgressdConfig `yaml:"egress"`
	Docker  DockerConfig  `yaml:"docker"`
	Images  ImagesConfig  `yaml:"images"`
	Console ConsoleConfig `yaml:"console"`
	// Pools are warm pools: sandboxes created ahead, enforced deny-all and held, that a
	// matching create claims in milliseconds (see lifecycle.PoolSpec). Default none.
	Pools []PoolConfig `yaml:"pools"`
	// Policies is the library of named policies.
	Policies PoliciesConfig `yaml:"policies"`
	// Vault configures the Credential Vault's injection (egressd/vault/README.md).
	Vault VaultConfig `yaml:"vault"`
	// Telemetry is OpenTelemetry export (OTLP logs, metrics, traces); off by default.
	Telemetry TelemetryConfig `yaml:"telemetry"`
}

// VaultConfig is the vault section of airlock.yaml.
type VaultConfig struct {
	// PlainHTTP says to which addresses a plain-HTTP request for a bound host may carry
	// a credential: learned (the default: only an address learned from a DNS answer for
	// the name) or policy (any address the sandbox's policy accepts for the name, also
	// one the sandbox chose with curl --resolve or /etc/hosts: whoever controls that
	// address reads the secret). HTTPS always verifies the upstream's certificate
	// against the name instead. The same as `airlock egressd --vault-plain-http`.
	PlainHTTP string `yaml:"plainHTTP"`
}

// PoolConfig declares one warm pool. A create matches it when it asks for the same
// image (after aliases) and the same resourceLimits, with no volumes and no
// credentialProxy; any entrypoint, env and policy are applied at claim.
type PoolConfig struct {
	// Name labels the pool's metrics; default the image.
	Name string `yaml:"name"`
	// Image is required.
	Image string `yaml:"image"`
	// Size is how many members are kept ready (1 to 256).
	Size int `yaml:"size"`
	// ResourceLimits as in a create request; the OpenSandbox SDKs send
	// {cpu: "1", memory: "2Gi"} unless told otherwise.
	ResourceLimits map[string]string `yaml:"resourceLimits"`
	// Entrypoint, when set, starts in each member as soon as it is warm (under the
	// member's deny-all policy); the pool then serves only creates with this
	// entrypoint and no env (lifecycle.PoolSpec.Entrypoint). For images whose
	// entrypoint is slow to start, such as airlock/browser's Chromium.
	Entrypoint []string `yaml:"entrypoint"`
	// ReadyPort, with Entrypoint: a member is claimable once the entrypoint accepts TCP
	// connections on this port (9222 for airlock/browser).
	ReadyPort int `yaml:"readyPort"`
	// ReadyPath, with ReadyPort: readiness is a GET of this path answering 2xx
	// (/json/version for airlock/browser).
	ReadyPath string `yaml:"readyPath"`
}

// DefaultImageAliases are the aliases every configuration starts with: the image the
// OpenSandbox SDKs' code interpreter asks for by default is served by Airlock's own
// (`airlock image build code-interpreter`), and the Chrome image of OpenSandbox's
// browser example (entrypoint /entrypoint, DevTools on 9222) by airlock/browser
// (`airlock image build browser`; it has /entrypoint too, but no VNC on 5901), and the
// image of OpenSandbox's desktop example (Xvfb, a window manager, x11vnc, noVNC) by
// airlock/desktop (`airlock image build desktop`; VNC on 5900, noVNC on 6080 once its
// entrypoint /opt/airlock/desktop.sh runs).
var DefaultImageAliases = map[string]string{
	"opensandbox/code-interpreter:latest": "airlock/code-interpreter:latest",
	"opensandbox/chrome:latest":           "airlock/browser:latest",
	"opensandbox/desktop:latest":          "airlock/desktop:latest",
}

// ImagesConfig configures how create requests name images.
type ImagesConfig struct {
	// Aliases maps an image a client asks for to the local image that serves it; the
	// sandbox keeps reporting the image asked for. Entries are added to
	// DefaultImageAliases (an entry for the same reference replaces the default one).
	Aliases map[string]string `yaml:"aliases"`
}

// LifecycleConfig tunes the lifecycle server.
type LifecycleConfig struct {
	// MaxTimeout caps a sandbox's timeout and renewals; default 24h.
	MaxTimeout Duration `yaml:"maxTimeout"`
	// ReadyTimeout is how long execd may take to answer after start; default 120s.
	ReadyTimeout Duration `yaml:"readyTimeout"`
	// MaxSignedURLLifetime caps how far in the future a signed endpoint may expire
	// (GET /v1/sandboxes/{id}/endpoints/{port}?expires=); default 24h
	// (lifecycle.DefaultMaxSignedURLLifetime).
	MaxSignedURLLifetime Duration `yaml:"maxSignedURLLifetime"`
	// Snapshots bounds snapshots (POST /v1/sandboxes/{id}/snapshots): how many exist of
	// one sandbox and in all, and the bytes they hold; a create past a limit answers 409
	// SNAPSHOT_LIMIT_EXCEEDED. Defaults 16, 256, 10 GiB and 100 GiB
	// (lifecycle.SnapshotLimits).
	Snapshots SnapshotsConfig `yaml:"snapshots"`
}

// SnapshotsConfig is lifecycle.snapshots in airlock.yaml (lifecycle.SnapshotLimits);
// zero keeps a default.
type SnapshotsConfig struct {
	MaxPerSandbox      int   `yaml:"maxPerSandbox"`
	MaxTotal           int   `yaml:"maxTotal"`
	MaxBytesPerSandbox int64 `yaml:"maxBytesPerSandbox"`
	MaxBytesTotal      int64 `yaml:"maxBytesTotal"`
}

// DockerConfig configures the Docker runtime (package lifecycle/docker).
type DockerConfig struct {
	// Network is the bridge network; default airlock0. Subnet is its IPv4 subnet when
	// Airlock creates it; default: Docker's choice.
	Network string `yaml:"network"`
	Subnet  string `yaml:"subnet"`
	// Subnet6, when set (a ULA /64 such as fd00:a1e::/64), makes the network dual
	// stack when Airlock creates it: sandboxes get an IPv6 address and egress filters
	// IPv6 like IPv4. Default: IPv4 only.
	Subnet6 string `yaml:"subnet6"`
	// Runtime is the engine runtime sandboxes run under unless their create names
	// another (extensions["airlock.dev/runtime"]): runsc is gVisor, which `make
	// prepare` installs and registers (lifecycle/docker/README.md#gvisor); default the
	// engine's (runc). Start fails when the engine does not have it.
	Runtime string `yaml:"runtime"`
	// OCIRuntime is the former name of Runtime: a file that sets it is refused with a
	// pointer to runtime (it was never documented beyond this struct).
	OCIRuntime string `yaml:"ociRuntime"`
	// AllowedHostRoots are the directories host-path volumes may come from; default
	// none (host-path volumes refused).
	AllowedHostRoots []string `yaml:"allowedHostRoots"`
	// ExecdPath is the static execd binary; default execd beside the airlock binary,
	// then /usr/local/lib/airlock/execd.
	ExecdPath string `yaml:"execdPath"`
	// NamePrefix starts container names; default airlock-.
	NamePrefix string `yaml:"namePrefix"`
	// MaxPTYSessions caps the interactive terminals (execd PTY sessions) each sandbox
	// may have at once; past it POST /pty answers 409 PTY_LIMIT_EXCEEDED. 0 (default):
	// execd's default, 16; negative: no limit. Docker only (Kubernetes sandboxes get
	// execd's default).
	MaxPTYSessions int `yaml:"maxPTYSessions"`
}

// LoadConfig reads the YAML file at path strictly (unknown keys are errors) over
// DefaultConfig: a key the file leaves out keeps its default, a key it gives replaces
// it (egress.l7Port: 0 is off). A missing file is an error unless optional is true
// (then the defaults apply).
func LoadConfig(path string, optional bool) (Config, error) {
	c := DefaultConfig()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && optional {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return c, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// setDefaults fills what the file and flags left empty and checks the result.
func (c *Config) setDefaults() error {
	switch c.Runtime {
	case "", "docker":
		c.Runtime = "docker"
	case "kubernetes":
		return fmt.Errorf("config: runtime kubernetes: airlock up runs one host with Docker; on a cluster run the control plane with 'airlock lifecycle' (manifests in deploy/kubernetes)")
	default:
		return fmt.Errorf("config: runtime %q: want docker or kubernetes", c.Runtime)
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	var err error
	if c.Gateway, err = c.Gateway.Resolved(); err != nil {
		return err
	}
	if c.Audit.Dir == "" {
		c.Audit.Dir = filepath.Join(c.StateDir, "audit")
	}
	if c.Audit, err = c.Audit.resolved(); err != nil {
		return err
	}
	if c.Policies.Dir == "" {
		c.Policies.Dir = library.DefaultDir
	}
	if c.Policies.Default != "" && !library.ValidName(c.Policies.Default) {
		return fmt.Errorf("config: policies.default %q is not a policy name (the file name without .yaml)", c.Policies.Default)
	}
	aliases := maps.Clone(DefaultImageAliases)
	for from, to := range c.Images.Aliases {
		if strings.TrimSpace(from) == "" || strings.TrimSpace(to) == "" || strings.ContainsAny(from+to, " \t\r\n") {
			return fmt.Errorf("config: images.aliases: %q: %q is not an image reference", from, to)
		}
		aliases[from] = to
	}
	c.Images.Aliases = aliases
	if c.Vault.PlainHTTP != "" {
		c.Egress.VaultPlainHTTP = c.Vault.PlainHTTP
	}
	if c.Egress, err = c.Egress.Resolved(); err != nil {
		return err
	}
	c.Vault.PlainHTTP = c.Egress.VaultPlainHTTP
	if c.Docker.ExecdPath == "" {
		c.Docker.ExecdPath = DefaultExecdPath()
	}
	if c.Docker.OCIRuntime != "" {
		return fmt.Errorf("config: docker.ociRuntime is now docker.runtime: write runtime: %s", c.Docker.OCIRuntime)
	}
	if c.Docker.Subnet != "" {
		if p, err := netip.ParsePrefix(c.Docker.Subnet); err != nil || !p.Addr().Is4() {
			return fmt.Errorf("config: docker.subnet: want an IPv4 prefix, got %q", c.Docker.Subnet)
		}
	}
	if c.Docker.Subnet6 != "" {
		if p, err := netip.ParsePrefix(c.Docker.Subnet6); err != nil || !p.Addr().Is6() || p.Addr().Is4In6() {
			return fmt.Errorf("config: docker.subnet6: want an IPv6 prefix (a ULA /64 such as fd00:a1e::/64), got %q", c.Docker.Subnet6)
		}
	}
	switch c.LogLevel {
	case "", "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("config: logLevel %q: want debug, info, warn or error", c.LogLevel)
	}
	return nil
}

// DefaultExecdPath is execd beside the running executable when present, else
// /usr/local/lib/airlock/execd.
func DefaultExecdPath() string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "execd")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "/usr/local/lib/airlock/execd"
}

// Doctor is the host check (package doctor) for this configuration: the state
// directory, the listen addresses, the Docker network and the egress plane `airlock up`
// would use, and the current sandbox image recipe.
func (c Config) Doctor() (doctor.Config, error) {
	c, err := c.Resolved()
	if err != nil {
		return doctor.Config{}, err
	}
	d := doctor.Config{
		StateDir:   c.StateDir,
		Listen:     c.Listen,
		Network:    c.Docker.Network,
		Egress:     !c.Egress.Disabled,
		RecipeHash: sandboximage.DefaultRecipe().Hash(),
		AuditDir:   c.Audit.Dir,
	}
	_, ret := c.Audit.writerLimits()
	d.AuditMaxBytes, d.AuditMaxAge = ret.MaxBytes, ret.MaxAge
	if !c.Gateway.Disabled {
		d.GatewayListen = c.Gateway.Listen
	}
	if c.Docker.Subnet != "" {
		d.Subnet = netip.MustParsePrefix(c.Docker.Subnet) // checked by setDefaults
	}
	return d, nil
}

// Resolved is c with every default filled in (state and audit directories, network,
// pin root, ...) and checked: what `airlock up` would run with.
func (c Config) Resolved() (Config, error) {
	if err := c.setDefaults(); err != nil {
		return c, err
	}
	if c.Docker.Network == "" {
		c.Docker.Network = "airlock0"
	}
	return c, nil
}
