package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/airlockdev/airlock/gateway/signedurl"
	"github.com/airlockdev/airlock/opensandbox"
)

// onDemandEnv runs the gateway with on-demand TLS from the internal CA, gated by
// tls.permission.airlock, with app options set in the airlock app's JSON.
func onDemandEnv(t *testing.T, appOpts map[string]any) (*env, func(name string) error) {
	t.Helper()
	dir := t.TempDir()
	edit := func(b []byte) []byte {
		var cfg map[string]any
		if err := json.Unmarshal(b, &cfg); err != nil {
			t.Fatal(err)
		}
		apps := cfg["apps"].(map[string]any)
		apps["tls"] = map[string]any{"automation": map[string]any{
			"on_demand": map[string]any{"permission": map[string]any{"module": "airlock"}},
			"policies":  []any{map[string]any{"on_demand": true, "issuers": []any{map[string]any{"module": "internal"}}}},
		}}
		app := apps["airlock"].(map[string]any)
		for k, v := range appOpts {
			app[k] = v
		}
		out, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	e := newEnvEdit(t, func(c *Config) {
		c.TLS = TLSInternal
		c.DataDir = dir
	}, edit, nil)
	var pool *x509.CertPool
	deadline := time.Now().Add(30 * time.Second)
	for pool == nil {
		if pem, err := os.ReadFile(e.gw.RootCertPath()); err == nil {
			pool = x509.NewCertPool()
			pool.AppendCertsFromPEM(pem)
		} else if time.Now().After(deadline) {
			t.Fatalf("internal CA root never appeared at %s", e.gw.RootCertPath())
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
	handshake := func(name string) error {
		d := &net.Dialer{Timeout: 10 * time.Second}
		conn, err := tls.DialWithDialer(d, "tcp", e.gw.Addr(), &tls.Config{RootCAs: pool, ServerName: name})
		if err != nil {
			return err
		}
		return conn.Close()
	}
	return e, handshake
}

// TestOnDemandTLSPermission: over a real TLS handshake, on-demand TLS obtains a
// certificate for a sandbox's host only while the sandbox is under the per-sandbox cap,
// and never for a signed host label unless the app allows them; then only for a tag that
// verifies under the sandbox's current epoch and never for a control port.
func TestOnDemandTLSPermission(t *testing.T) {
	t.Run("cap_and_signed_refused", func(t *testing.T) {
		e, handshake := onDemandEnv(t, map[string]any{"max_certificates_per_sandbox": 3})
		e.put(runningSandbox("odt", netip.MustParseAddr("127.0.0.1")))
		signed, err := e.keys.Mint("odt", 8080, time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		label, _ := signed.Label()
		for _, c := range []struct {
			host   string
			result string
		}{
			{"8080-odt.airlock.localhost", certAllowed},
			{label + ".airlock.localhost", certSignedHost},
			{"8080-nobody.airlock.localhost", certUnknownSandbox},
			{"odt-8081.airlock.localhost", certAllowed},
			{"8082-odt.airlock.localhost", certAllowed},
			{"8083-odt.airlock.localhost", certOverCap},
			{"8080-odt.airlock.localhost", certAllowed}, // a host allowed before stays allowed
		} {
			before := metricValue(t, e.reg, "airlock_gateway_certificate_permissions_total", map[string]string{"result": c.result})
			err := handshake(c.host)
			if (err == nil) != (c.result == certAllowed) {
				t.Fatalf("%s: handshake err %v, want result %s", c.host, err, c.result)
			}
			after := metricValue(t, e.reg, "airlock_gateway_certificate_permissions_total", map[string]string{"result": c.result})
			if c.result != certAllowed && after != before+1 {
				t.Fatalf("%s: %s count %v -> %v, want +1", c.host, c.result, before, after)
			}
		}
	})
	t.Run("signed_allowed_verified", func(t *testing.T) {
		e, handshake := onDemandEnv(t, map[string]any{"signed_host_certificates": true})
		sb := runningSandbox("ods", netip.MustParseAddr("127.0.0.1"))
		e.put(sb)
		exp := time.Now().Add(time.Hour)
		mint := func(port int, epoch uint64) string {
			r, err := e.keys.MintEpoch("ods", port, exp, epoch)
			if err != nil {
				t.Fatal(err)
			}
			l, err := r.Label()
			if err != nil {
				t.Fatal(err)
			}
			return l + ".airlock.localhost"
		}
		other, _ := signedurl.NewKeyring("k", signedurl.Key{ID: "k", Secret: []byte("another-secret-0123456789abcdef")})
		forged, _ := other.Mint("ods", 8080, exp)
		forgedLabel, _ := forged.Label()
		expiredR, _ := e.keys.Mint("ods", 8081, time.Now().Add(-time.Minute))
		expired, _ := expiredR.Label()
		for _, c := range []struct {
			host string
			ok   bool
		}{
			{mint(8080, 0), true},
			{mint(opensandbox.ExecdPort, 0), false},
			{mint(opensandbox.EgressAPIPort, 0), false},
			{forgedLabel + ".airlock.localhost", false},
			{expired + ".airlock.localhost", false},
		} {
			if err := handshake(c.host); (err == nil) != c.ok {
				t.Fatalf("%s: handshake err %v, want ok=%v", c.host, err, c.ok)
			}
		}
		// Revocation: under epoch 1 the epoch-0 URL gets no certificate, epoch 1's does.
		sb.Access.SignedEpoch = 1
		e.put(sb)
		if err := handshake(mint(8082, 0)); err == nil {
			t.Fatal("certificate for a signed host minted before the revocation")
		}
		if err := handshake(mint(8082, 1)); err != nil {
			t.Fatalf("signed host under the current epoch: %v", err)
		}
	})
}
