package main

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/cluster"
	"github.com/airlockdev/airlock/stack"
)

// upConfig is the configuration `airlock up` runs with for the airlock.yaml body y
// (LoadConfig and Resolved, as up does).
func upConfig(t *testing.T, y string) stack.Config {
	t.Helper()
	p := filepath.Join(t.TempDir(), "airlock.yaml")
	if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := stack.LoadConfig(p, false)
	if err != nil {
		t.Fatal(err)
	}
	if c, err = c.Resolved(); err != nil {
		t.Fatal(err)
	}
	return c
}

// clearServerEnv empties the environment the standalone commands read.
func clearServerEnv(t *testing.T) {
	for _, k := range []string{"NODE_NAME", "OPEN_SANDBOX_API_KEY", "AIRLOCK_SIGNING_KEYS", "AIRLOCK_GATEWAY_KEY", "POD_NAME", "POD_NAMESPACE"} {
		t.Setenv(k, "")
	}
}

// TestEgressdSameConfig: the same settings, given as `airlock egressd` flags (parsed by
// the real command's flag set) and as airlock.yaml's egress section, give the same
// stack.EgressdConfig, the one NewEgressd builds egressd from; nothing set gives the
// defaults on both paths, and 0 turns the L7 proxy off on both.
func TestEgressdSameConfig(t *testing.T) {
	clearServerEnv(t)
	for _, tc := range []struct {
		name  string
		flags []string
		yaml  string
		check func(stack.EgressdConfig) bool
	}{
		{"defaults", nil, "", func(c stack.EgressdConfig) bool {
			return c.L7Port == 15001 && c.Mode == "auto" && c.NFTTable == "airlock" && c.PinRoot == "/sys/fs/bpf/airlock" && c.ProxyPort == 0 &&
				c.VaultPlainHTTP == "learned" &&
				c.DNSGuard == stack.DNSGuard{NamesPerSandbox: 300, NamesPerDomain: 100, NamesPerRule: 200, MaxLabelBits: 160}
		}},
		{"vault_plain_http", []string{"--vault-plain-http=policy"}, "vault: {plainHTTP: policy}",
			func(c stack.EgressdConfig) bool { return c.VaultPlainHTTP == "policy" }},
		{"l7_off", []string{"--l7-port=0"}, "egress: {l7Port: 0}", func(c stack.EgressdConfig) bool { return c.L7Port == 0 }},
		{"l7_port", []string{"--l7-port", "16001"}, "egress: {l7Port: 16001}", func(c stack.EgressdConfig) bool { return c.L7Port == 16001 }},
		{"proxy_port", []string{"--proxy-port=3128"}, "egress: {proxyPort: 3128}", func(c stack.EgressdConfig) bool { return c.ProxyPort == 3128 }},
		{"datapath", []string{"--mode=nftables", "--nft-table=airlock_b", "--pin-root=/sys/fs/bpf/airlock-b"},
			"egress:\n  mode: nftables\n  nftTable: airlock_b\n  pinRoot: /sys/fs/bpf/airlock-b\n",
			func(c stack.EgressdConfig) bool { return c.Mode == "nftables" && c.NFTTable == "airlock_b" }},
		{"upstreams", []string{"--upstream=192.0.2.53", "--upstream", "192.0.2.54:5353"},
			"egress: {upstreams: [192.0.2.53, \"192.0.2.54:5353\"]}",
			func(c stack.EgressdConfig) bool {
				return reflect.DeepEqual(c.Upstreams, []string{"192.0.2.53:53", "192.0.2.54:5353"})
			}},
		{"dns_guard", []string{"--dns-names-per-sandbox=50", "--dns-names-per-domain=-1", "--dns-max-label-bits=120"},
			"egress: {dnsGuard: {namesPerSandbox: 50, namesPerDomain: -1, maxLabelBits: 120}}",
			func(c stack.EgressdConfig) bool {
				return c.DNSGuard == stack.DNSGuard{NamesPerSandbox: 50, NamesPerDomain: -1, NamesPerRule: 200, MaxLabelBits: 120}
			}},
		{"deny", []string{"--deny=10.20.0.0/16", "--deny", "control.example.com"},
			"egress: {deny: [10.20.0.0/16, control.example.com]}",
			func(c stack.EgressdConfig) bool { return len(c.Deny) == 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ef := &egressdFlags{}
			cmd := egressdCommand(ef)
			if err := cmd.ParseFlags(tc.flags); err != nil {
				t.Fatal(err)
			}
			fromFlags, err := ef.config()
			if err != nil {
				t.Fatal(err)
			}
			fromYAML := upConfig(t, tc.yaml).Egress
			if !reflect.DeepEqual(fromFlags, fromYAML) {
				t.Errorf("flags %q give\n  %+v\nairlock.yaml %q gives\n  %+v", tc.flags, fromFlags, tc.yaml, fromYAML)
			}
			if !tc.check(fromFlags) {
				t.Errorf("flags %q give %+v", tc.flags, fromFlags)
			}
		})
	}
	// The old spelling of "off" in airlock.yaml is refused on both paths, not read as
	// a port or as the default.
	ef := &egressdFlags{}
	if err := egressdCommand(ef).ParseFlags([]string{"--l7-port=-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ef.config(); err == nil || !strings.Contains(err.Error(), "0 turns the L7 proxy off") {
		t.Errorf("--l7-port=-1: %v", err)
	}
	c := stack.DefaultConfig()
	c.Egress.L7Port = -1
	if _, err := c.Resolved(); err == nil || !strings.Contains(err.Error(), "0 turns the L7 proxy off") {
		t.Errorf("egress.l7Port: -1: %v", err)
	}
	// vault.plainHTTP takes learned or policy only, on both paths.
	ef = &egressdFlags{}
	if err := egressdCommand(ef).ParseFlags([]string{"--vault-plain-http=always"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ef.config(); err == nil || !strings.Contains(err.Error(), "vault.plainHTTP") {
		t.Errorf("--vault-plain-http=always: %v", err)
	}
	c = stack.DefaultConfig()
	c.Vault.PlainHTTP = "always"
	if _, err := c.Resolved(); err == nil || !strings.Contains(err.Error(), "vault.plainHTTP") {
		t.Errorf("vault.plainHTTP: always: %v", err)
	}
}

// TestGatewaySameConfig: the same settings, given as `airlock gateway` flags and as
// airlock.yaml's gateway section, give the same stack.GatewayConfig, the one NewGateway
// builds the gateway from.
func TestGatewaySameConfig(t *testing.T) {
	clearServerEnv(t)
	for _, tc := range []struct {
		name  string
		flags []string
		yaml  string
		check func(stack.GatewayConfig) bool
	}{
		{"defaults", nil, "", func(c stack.GatewayConfig) bool {
			return c.Listen == "127.0.0.1:8081" && reflect.DeepEqual(c.RouteDomains, []string{"airlock.localhost"}) &&
				c.MaxConnsPerSandbox == 1024 && c.DefaultAccess == "public" && c.TLS == ""
		}},
		{"listen", []string{"--listen=0.0.0.0:9443"}, "gateway: {listen: \"0.0.0.0:9443\"}", func(c stack.GatewayConfig) bool { return c.Listen == "0.0.0.0:9443" }},
		{"route_domains", []string{"--base-domain=sbx.example.com", "--base-domain", "sbx.example.org"},
			"gateway: {routeDomains: [sbx.example.com, sbx.example.org]}",
			func(c stack.GatewayConfig) bool {
				return reflect.DeepEqual(c.RouteDomains, []string{"sbx.example.com", "sbx.example.org"})
			}},
		{"host_routing_off", []string{"--base-domain="}, "gateway: {routeDomains: []}", func(c stack.GatewayConfig) bool {
			return c.RouteDomains != nil && len(c.RouteDomains) == 0
		}},
		{"max_conns", []string{"--max-conns-per-sandbox=-1"}, "gateway: {maxConnsPerSandbox: -1}", func(c stack.GatewayConfig) bool { return c.MaxConnsPerSandbox == -1 }},
		{"tls_admin", []string{"--tls=internal", "--admin-listen=127.0.0.1:2019"}, "gateway: {tls: internal, adminListen: \"127.0.0.1:2019\"}",
			func(c stack.GatewayConfig) bool { return c.TLS == "internal" && c.AdminListen == "127.0.0.1:2019" }},
		{"refuse_api_key", []string{"--refuse-api-key"}, "gateway: {refuseAPIKey: true}", func(c stack.GatewayConfig) bool { return c.RefuseAPIKey }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gf := &gatewayFlags{}
			cmd := gatewayCommand(gf)
			if err := cmd.ParseFlags(tc.flags); err != nil {
				t.Fatal(err)
			}
			fromFlags, err := gf.config()
			if err != nil {
				t.Fatal(err)
			}
			fromYAML := upConfig(t, tc.yaml).Gateway
			if !reflect.DeepEqual(fromFlags, fromYAML) {
				t.Errorf("flags %q give\n  %+v\nairlock.yaml %q gives\n  %+v", tc.flags, fromFlags, tc.yaml, fromYAML)
			}
			if !tc.check(fromFlags) {
				t.Errorf("flags %q give %+v", tc.flags, fromFlags)
			}
		})
	}
}

// TestAuditSameConfig: the --audit-* flags of egressd and the gateway and airlock.yaml's
// audit section give the same stack.AuditConfig (OpenAudit's); with nothing set only
// the directory differs: airlock up has a state directory, a standalone server writes
// no audit until given one.
func TestAuditSameConfig(t *testing.T) {
	clearServerEnv(t)
	for _, tc := range []struct {
		name  string
		flags []string
		yaml  string
	}{
		{"defaults", nil, ""},
		{"dir", []string{"--audit-dir=/srv/audit"}, "audit: {dir: /srv/audit}"},
		{"key_and_size", []string{"--audit-dir=/srv/audit", "--audit-signing-key=/etc/airlock/audit.key", "--audit-max-file-bytes=1048576"},
			"audit: {dir: /srv/audit, signingKeyFile: /etc/airlock/audit.key, maxFileBytes: 1048576}"},
		{"ocsf_off", []string{"--audit-dir=/srv/audit", "--audit-ocsf=false"}, "audit: {dir: /srv/audit, ocsf: {disabled: true}}"},
		{"ocsf_on", []string{"--audit-dir=/srv/audit", "--audit-ocsf"}, "audit: {dir: /srv/audit, ocsf: {disabled: false}}"},
		{"anchors", []string{"--audit-dir=/srv/audit", "--audit-anchors-dir=/mnt/anchors/host1", "--audit-anchors-url=https://anchors.example/v1/host1"},
			"audit: {dir: /srv/audit, anchors: {dir: /mnt/anchors/host1, url: \"https://anchors.example/v1/host1\"}}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fromYAML := upConfig(t, tc.yaml).Audit
			if len(tc.flags) == 0 {
				if fromYAML.Dir != "/var/lib/airlock/audit" {
					t.Errorf("airlock up's default audit directory %q", fromYAML.Dir)
				}
				fromYAML.Dir = ""
			}
			ef, gf := &egressdFlags{}, &gatewayFlags{}
			if err := egressdCommand(ef).ParseFlags(tc.flags); err != nil {
				t.Fatal(err)
			}
			if err := gatewayCommand(gf).ParseFlags(tc.flags); err != nil {
				t.Fatal(err)
			}
			e, err := ef.config()
			if err != nil {
				t.Fatal(err)
			}
			g, err := gf.config()
			if err != nil {
				t.Fatal(err)
			}
			if e.Audit != fromYAML || g.Audit != fromYAML {
				t.Errorf("egressd flags give %+v, gateway flags %+v, airlock.yaml %+v", e.Audit, g.Audit, fromYAML)
			}
			lf := &lifecycleFlags{}
			if err := lifecycleCommand(lf).ParseFlags(tc.flags); err != nil {
				t.Fatal(err)
			}
			if lf.audit != fromYAML {
				t.Errorf("lifecycle flags give %+v, airlock.yaml %+v", lf.audit, fromYAML)
			}
			if fromYAML.OCSF.Disabled != strings.Contains(tc.name, "off") {
				t.Errorf("OCSF export disabled = %v", fromYAML.OCSF.Disabled)
			}
			if fromYAML.MaxFileBytes <= 0 {
				t.Errorf("no default file size: %+v", fromYAML)
			}
			if tc.name == "anchors" && (fromYAML.Anchors.Dir != "/mnt/anchors/host1" || fromYAML.Anchors.URL != "https://anchors.example/v1/host1") {
				t.Errorf("anchors not set: %+v", fromYAML.Anchors)
			}
		})
	}
}

// TestLifecycleFlagsFillConfig: `airlock lifecycle` with no flags runs
// cluster.DefaultConfig (the environment's secrets aside), and each flag sets its field.
func TestLifecycleFlagsFillConfig(t *testing.T) {
	clearServerEnv(t)
	for _, tc := range []struct {
		name  string
		flags []string
		want  func(*cluster.Config)
	}{
		{"defaults", nil, func(*cluster.Config) {}},
		{"settings", []string{"--listen=:9090", "--namespace=sbx", "--system-namespace=sys", "--provider=agent-sandbox",
			"--dns=10.0.0.10", "--dns=10.0.0.11", "--egressd-port=0", "--lease-duration=30s", "--default-access=token",
			"--ready-timeout=1m", "--max-timeout=2h", "--base-domain=sbx.example.com", "--gateway=gw.example.com"},
			func(c *cluster.Config) {
				c.Listen, c.Namespace, c.SystemNamespace, c.Provider = ":9090", "sbx", "sys", "agent-sandbox"
				c.DNS = []netip.Addr{netip.MustParseAddr("10.0.0.10"), netip.MustParseAddr("10.0.0.11")}
				c.EgressdPort, c.LeaseDuration, c.DefaultAccess = 0, 30*time.Second, "token"
				c.ReadyTimeout, c.Limits.MaxTimeout = time.Minute, 2*time.Hour
				c.BaseDomain, c.Gateway = "sbx.example.com", "gw.example.com"
			}},
		{"console", []string{"--no-console", "--console-session-ttl=1h", "--console-trusted-origin=https://airlock.example.com"},
			func(c *cluster.Config) {
				c.Console = cluster.ConsoleConfig{Disabled: true, SessionTTL: time.Hour, TrustedOrigins: []string{"https://airlock.example.com"}}
			}},
		{"deny", []string{"--deny=10.244.0.0/24", "--deny=10.96.0.9/16", "--deny=10.0.0.1", "--deny=fd00::/64"},
			func(c *cluster.Config) {
				c.Deny = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24"), netip.MustParsePrefix("10.96.0.0/16"),
					netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("fd00::/64")}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lf := &lifecycleFlags{}
			if err := lifecycleCommand(lf).ParseFlags(tc.flags); err != nil {
				t.Fatal(err)
			}
			got, err := lf.config()
			if err != nil {
				t.Fatal(err)
			}
			want := cluster.DefaultConfig()
			tc.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("flags %q give\n  %+v\nwant\n  %+v", tc.flags, got, want)
			}
		})
	}
}
