package main

import (
	"os"
	"strings"
	"testing"
)

// TestPolicyExplainFloor: --floor lists the built-in entries and the special-address
// classes; an address in the floor is explained as the floor even under a policy that
// allows it explicitly, and a private address as the guard.
func TestPolicyExplainFloor(t *testing.T) {
	out, err := run(t, newPolicyCmd(), "explain", "--floor")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"platform floor:", "overlay.alwaysDeny[0]", "169.254.169.254", "instance metadata",
		"168.63.129.16", "special addresses:", "10.0.0.0/8"} {
		if !strings.Contains(out, want) {
			t.Errorf("--floor lacks %q:\n%s", want, out)
		}
	}
	file := t.TempDir() + "/p.yaml"
	writeFile(t, file, "egress:\n  - {action: allow, target: 169.254.169.254}\n  - {action: allow, target: \"*\"}\n")
	out, err = run(t, newPolicyCmd(), "explain", file, "169.254.169.254", "--port", "80")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "decision: deny") || !strings.Contains(out, "floor:    the platform floor denies this (169.254.169.254, built-in") {
		t.Errorf("explain of the metadata address:\n%s", out)
	}
	out, _ = run(t, newPolicyCmd(), "explain", file, "10.9.8.7", "--port", "80")
	if !strings.Contains(out, "floor:    a special address") {
		t.Errorf("explain of a private address:\n%s", out)
	}
	if _, err := run(t, newPolicyCmd(), "explain", file); err == nil {
		t.Error("explain FILE without a target (and without --floor) passed")
	}
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}
