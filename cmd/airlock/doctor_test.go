package main

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/lctest"
)

// TestDoctorAndUpRefuseTakenPort holds the API port: `airlock doctor` names it with the
// fix and exits 1; `airlock up` refuses to start with the same message and leaves
// nothing behind (no state directory).
func TestDoctorAndUpRefuseTakenPort(t *testing.T) {
	bin := lctest.Airlock(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().String()
	state := filepath.Join(t.TempDir(), "state")
	empty := filepath.Join(t.TempDir(), "airlock.yaml") // not the host's /etc/airlock/airlock.yaml
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", empty, "--state-dir", state, "--listen", taken,
		"--gateway-listen", "127.0.0.1:0", "--no-egress"}

	out, err := exec.Command(bin, append([]string{"doctor"}, args...)...).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("doctor with the API port taken: err %v, want exit status 1\n%s", err, out)
	}
	for _, want := range []string{"port: lifecycle API", taken + "/tcp is taken", "airlock down", "hard problem"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}

	up := exec.Command(bin, append([]string{"up"}, args...)...)
	done := make(chan error, 1)
	var upOut strings.Builder
	up.Stdout, up.Stderr = &upOut, &upOut
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- up.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("airlock up started with its API port taken:\n%s", upOut.String())
		}
	case <-time.After(60 * time.Second):
		up.Process.Kill()
		t.Fatalf("airlock up did not refuse within 60 s:\n%s", upOut.String())
	}
	for _, want := range []string{"this host cannot run Airlock", "port: lifecycle API", "airlock down"} {
		if !strings.Contains(upOut.String(), want) {
			t.Errorf("airlock up's refusal lacks %q:\n%s", want, upOut.String())
		}
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("a refused airlock up created %s (err %v)", state, err)
	}
}
