package stack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/execd/execdtest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
	"github.com/airlockdev/airlock/sdk"
	"github.com/coder/websocket"
)

// TestAgentActionsAudited: commands and code run in a real sandbox through the gateway
// (the SDK's endpoint) and through lifecycle's server proxy, and a file uploaded
// through the gateway, are in the hash-chained audit log as source execd records made
// on the host: the command's text, exit code and duration, the code and its language,
// the file's path, size and SHA-256, with the entry point and request id; the log
// verifies with its signing key. With audit.agentActions.hashCommands the records hold
// the SHA-256 of the command and no text.
func TestAgentActionsAudited(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	for _, hashed := range []bool{false, true} {
		t.Run(map[bool]string{false: "text", true: "hashed"}[hashed], func(t *testing.T) {
			s, c := startTestStack(t, func(cfg *Config) {
				cfg.Egress.Disabled = true
				cfg.Audit.AgentActions.HashCommands = hashed
			})
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			sb, err := c.Create(ctx, sdk.CreateRequest{Image: img})
			if err != nil {
				t.Fatal(err)
			}
			x, err := c.Execd(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if err := x.WaitReady(ctx); err != nil {
				t.Fatal(err)
			}
			// Through the gateway (the endpoint the SDK is given).
			const gwCmd = "echo via-gateway; exit 7"
			if ex, err := x.Run(ctx, sdk.Command{Command: gwCmd}, nil); err != nil || ex.ExitCode() != 7 {
				t.Fatalf("run through the gateway: %+v %v", ex, err)
			}
			const gwCode = "print(6 * 7)"
			if ex, err := x.RunCode(ctx, sdk.CodeContext{Language: "python"}, gwCode, nil); err != nil || ex.Error != nil {
				t.Fatalf("code through the gateway: %+v %v", ex, err)
			}
			content := bytes.Repeat([]byte("uploaded through the gateway\n"), 5000)
			if err := x.WriteFile(ctx, "/tmp/up/data.txt", bytes.NewReader(content), 640); err != nil {
				t.Fatal(err)
			}
			// Through lifecycle's server proxy, with the API key.
			const spCmd = "echo via-server-proxy"
			proxied := func(path, body string) string {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost,
					"http://"+s.Addr.String()+"/sandboxes/"+sb.ID+"/proxy/44772"+path, strings.NewReader(body))
				req.Header.Set(opensandbox.HeaderAPIKey, s.APIKey)
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode/100 != 2 {
					t.Fatalf("server proxy %s: %d %s", path, resp.StatusCode, b)
				}
				return string(b)
			}
			if out := proxied("/command", `{"command":"`+spCmd+`"}`); !strings.Contains(out, "execution_complete") {
				t.Fatalf("server proxy stream: %s", out)
			}
			if out := proxied("/code", `{"code":"1/0"}`); !strings.Contains(out, "ZeroDivisionError") {
				t.Fatalf("server proxy code stream: %s", out)
			}

			// A PTY through the server proxy: opened, attached (WebSocket), closed.
			var pty struct {
				SessionID string `json:"session_id"`
			}
			if err := json.Unmarshal([]byte(proxied("/pty", `{}`)), &pty); err != nil || pty.SessionID == "" {
				t.Fatalf("POST /pty: %+v %v", pty, err)
			}
			hdr := http.Header{opensandbox.HeaderAPIKey: {s.APIKey}}
			pc := execdtest.MustDialPTY(t, "ws://"+s.Addr.String()+"/sandboxes/"+sb.ID+"/proxy/44772/pty/"+pty.SessionID+"/ws", hdr, nil)
			pc.WaitFor(t, "connected", 10*time.Second)
			pc.Stdin(t, "echo pty-$((6*7))\n")
			pc.Expect(t, "pty-42", 10*time.Second)
			pc.WS.Close(websocket.StatusNormalClosure, "")
			del, _ := http.NewRequestWithContext(ctx, http.MethodDelete,
				"http://"+s.Addr.String()+"/sandboxes/"+sb.ID+"/proxy/44772/pty/"+pty.SessionID, nil)
			del.Header = hdr.Clone()
			if resp, err := http.DefaultClient.Do(del); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("DELETE /pty: %v %v", resp, err)
			} else {
				resp.Body.Close()
			}

			dir := filepath.Join(s.cfg.StateDir, "audit")
			var recs []audit.Record
			deadline := time.Now().Add(10 * time.Second)
			for {
				recs = nil
				all, _, err := audit.Query(dir, audit.Filter{SandboxID: sb.ID})
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range all {
					if r.Source == audit.SourceExecd {
						recs = append(recs, r)
					}
				}
				if len(recs) >= 8 || time.Now().After(deadline) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			find := func(op, entry string, match func(x map[string]any) bool) map[string]any {
				t.Helper()
				for _, r := range recs {
					if r.Extra["op"] == op && r.Extra["entry"] == entry && match(r.Extra) {
						if r.Extra["request_id"] == "" || r.Extra["duration_ms"] == nil {
							t.Errorf("%s record without request id or duration: %+v", op, r.Extra)
						}
						return r.Extra
					}
				}
				t.Fatalf("no %s record through %s in %+v", op, entry, recs)
				return nil
			}
			text := func(k, want string) func(map[string]any) bool {
				sum := sha256.Sum256([]byte(want))
				return func(x map[string]any) bool {
					if hashed {
						_, has := x[k]
						return !has && x[k+"_sha256"] == hex.EncodeToString(sum[:])
					}
					return x[k] == want
				}
			}
			if x := find("command", "gateway", text("command", gwCmd)); x["exit_code"] != float64(7) || x["outcome"] != "failure" {
				t.Errorf("gateway command record: %+v", x)
			}
			if x := find("command", "server_proxy", text("command", spCmd)); x["exit_code"] != float64(0) || x["outcome"] != "success" ||
				x["execution_ms"] == nil || x["principal"] != principal.ConfiguredAdminID {
				t.Errorf("server proxy command record: %+v", x)
			}
			if x := find("code", "gateway", text("code", gwCode)); x["language"] != "python" || x["outcome"] != "success" {
				t.Errorf("gateway code record: %+v", x)
			}
			if x := find("code", "server_proxy", text("code", "1/0")); x["error"] != "ZeroDivisionError" || x["outcome"] != "failure" {
				t.Errorf("server proxy code record: %+v", x)
			}
			isPTY := func(x map[string]any) bool { return x["session_id"] == pty.SessionID }
			if x := find("pty.open", "server_proxy", isPTY); x["outcome"] != "success" {
				t.Errorf("pty.open record: %+v", x)
			}
			if x := find("pty.attach", "server_proxy", isPTY); x["status"] != float64(http.StatusSwitchingProtocols) || x["outcome"] != "success" {
				t.Errorf("pty.attach record: %+v", x)
			}
			if x := find("pty.close", "server_proxy", isPTY); x["outcome"] != "success" {
				t.Errorf("pty.close record: %+v", x)
			}
			sum := sha256.Sum256(content)
			if x := find("file.upload", "gateway", func(x map[string]any) bool { return x["path"] == "/tmp/up/data.txt" }); x["size"] != float64(len(content)) ||
				x["sha256"] != hex.EncodeToString(sum[:]) || x["mode"] != "640" {
				t.Errorf("upload record: %+v", x)
			}
			if hashed {
				for _, r := range recs {
					b, _ := r.Canonical()
					for _, secret := range []string{"via-gateway", "via-server-proxy", "6 * 7"} {
						if bytes.Contains(b, []byte(secret)) {
							t.Errorf("hashed mode, but a record holds %q: %s", secret, b)
						}
					}
				}
			}
			if err := c.Kill(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			// The same chain verifies, signatures checked (airlock audit verify).
			if err := s.Audit.Close(); err != nil {
				t.Fatal(err)
			}
			_, pubFile := audit.DefaultKeyFiles(dir)
			pub, err := audit.LoadPublicKey(pubFile)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := audit.Verify(dir, audit.VerifyOptions{PublicKey: pub})
			if err != nil {
				t.Fatalf("verify: %v (%+v)", err, rep)
			}
		})
	}
}
