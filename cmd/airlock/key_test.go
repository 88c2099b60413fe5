package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/internal/lctest"
)

// runKey executes `airlock key args...` in process with key; it returns stdout and the
// command's error.
func runKey(t *testing.T, h *lctest.Harness, key string, args ...string) (string, error) {
	t.Helper()
	cmd := newKeyCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append([]string{"--server", h.HTTP.URL, "--api-key", key}, args...))
	err := cmd.ExecuteContext(t.Context())
	return out.String(), err
}

// lastLine is the key printed by create and rotate.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestKeyCLI: `airlock key create | list | whoami | rotate | revoke` against a real
// lifecycle server: a user key made by the admin works, is refused key management,
// stops working when rotated away or revoked.
func TestKeyCLI(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: cliKey})
	out, err := runKey(t, h, cliKey, "create", "--name", "ci bot", "--role", "user")
	if err != nil || !strings.Contains(out, "role user") {
		t.Fatalf("key create: %v\n%s", err, out)
	}
	userKey := lastLine(out)
	if !strings.HasPrefix(userKey, "ak_") {
		t.Fatalf("key create printed no key last: %q", out)
	}
	id := strings.Fields(strings.SplitN(out, " of ", 2)[1])[0]

	if out, err := runKey(t, h, cliKey, "list"); err != nil || !strings.Contains(out, id) || !strings.Contains(out, "ci bot") ||
		!strings.Contains(out, "admin") || strings.Contains(out, userKey) {
		t.Fatalf("key list: %v\n%s", err, out)
	}
	if out, err := runKey(t, h, userKey, "whoami"); err != nil || !strings.HasPrefix(out, id+" (ci bot), role user") {
		t.Fatalf("key whoami as the user: %v %q", err, out)
	}
	if _, err := runKey(t, h, userKey, "list"); err == nil || !strings.Contains(err.Error(), "FORBIDDEN") {
		t.Fatalf("key list as a user: %v, want 403 FORBIDDEN", err)
	}

	out, err = runKey(t, h, cliKey, "rotate", id)
	if err != nil {
		t.Fatalf("key rotate: %v", err)
	}
	rotated := lastLine(out)
	if _, err := runKey(t, h, userKey, "whoami"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("whoami with the rotated-away key: %v, want 401", err)
	}
	if out, err := runKey(t, h, rotated, "whoami"); err != nil || !strings.HasPrefix(out, id+" ") {
		t.Fatalf("whoami with the rotated key: %v %q", err, out)
	}
	if out, err := runKey(t, h, cliKey, "revoke", id); err != nil || out != id+" revoked\n" {
		t.Fatalf("key revoke: %v %q", err, out)
	}
	if _, err := runKey(t, h, rotated, "whoami"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("whoami with the revoked key: %v, want 401", err)
	}
	if _, err := runKey(t, h, cliKey, "create", "--name", "x", "--role", "root"); err == nil {
		t.Fatal("key create accepted role root")
	}
}
