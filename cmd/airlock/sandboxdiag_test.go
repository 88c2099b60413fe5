package main

import (
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// `airlock sandbox logs|events` on a sandbox whose entrypoint printed lines and exited
// 3: the lines, the exit code, inline and downloaded (--url, the SDK's DiagnosticText).
func TestSandboxDiagnosticsCLI(t *testing.T) {
	h := lctest.New(t, lctest.Options{APIKey: cliKey, ResyncInterval: 200 * time.Millisecond})
	c, err := sdk.New(sdk.Config{BaseURL: h.HTTP.URL, APIKey: cliKey})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(t.Context(), sdk.CreateRequest{Image: h.Image, Timeout: 5 * time.Minute,
		Entrypoint: []string{"sh", "-c", "echo first-line; echo last-line; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitState(t.Context(), sb.ID, opensandbox.Failed, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"logs", sb.ID}, {"logs", "--url", sb.ID}} {
		out := runSandbox(t, h, args...)
		if !strings.Contains(out, "Z first-line\n") || !strings.Contains(out, "Z last-line\n") {
			t.Errorf("airlock sandbox %s:\n%s", strings.Join(args, " "), out)
		}
	}
	for _, args := range [][]string{{"events", sb.ID}, {"events", "--scope", "runtime", "--url", sb.ID}} {
		if out := runSandbox(t, h, args...); !strings.Contains(out, "exit code 3") {
			t.Errorf("airlock sandbox %s:\n%s", strings.Join(args, " "), out)
		}
	}
}
