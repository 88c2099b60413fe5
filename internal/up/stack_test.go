package up

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
)

func TestMain(m *testing.M) {
	code := m.Run()
	lctest.RemoveNetwork("altest-up0")
	os.Exit(code)
}

// TestStartFailureStopsInReverse: when the last component (the listener) cannot start,
// Start fails and every started component is stopped (the store's lock is released).
func TestStartFailureStopsInReverse(t *testing.T) {
	testenv.NeedDocker(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	dir := t.TempDir()
	cfg := Config{Listen: busy.Addr().String(), StateDir: dir, Docker: DockerConfig{Network: "altest-up0", ExecdPath: lctest.Execd(t)}}
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "starting api") {
		t.Fatalf("Start: %v", err)
	}
	st, err := lifecycle.OpenStore(filepath.Join(dir, "lifecycle.db"))
	if err != nil {
		t.Fatalf("store still locked after a failed start: %v", err)
	}
	st.Close()

	// The same configuration on a free port starts and stops cleanly.
	cfg.Listen = "127.0.0.1:0"
	s, err = New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s.Addr == nil || s.APIKey == "" || s.Lifecycle == nil {
		t.Errorf("started stack %+v", s)
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}
