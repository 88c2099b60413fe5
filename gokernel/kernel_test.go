package gokernel_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/execd/jupyter"
)

// startKernel builds airlock-gokernel and starts it through execd's Jupyter client, the
// way execd starts it in a sandbox.
func startKernel(t *testing.T) *jupyter.Kernel {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "airlock-gokernel")
	cmd := exec.Command("go", "build", "-o", bin, "../cmd/airlock-gokernel")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k, err := jupyter.Start(ctx, jupyter.Config{
		Spec:     jupyter.Spec{Name: "go", Language: "go", Argv: []string{bin, "{connection_file}"}},
		Dir:      t.TempDir(),
		StateDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

type run struct {
	status  string
	types   []string
	stdout  string
	result  string
	ename   string
	tb      []string
	elapsed time.Duration
}

func execute(t *testing.T, k *jupyter.Kernel, ctx context.Context, code string) run {
	t.Helper()
	var r run
	start := time.Now()
	st, err := k.Execute(ctx, code, func(m jupyter.Message) {
		var c struct {
			Name      string            `json:"name"`
			Text      string            `json:"text"`
			Data      map[string]string `json:"data"`
			EName     string            `json:"ename"`
			Traceback []string          `json:"traceback"`
		}
		json.Unmarshal(m.Content, &c)
		r.types = append(r.types, m.Header.MsgType)
		switch m.Header.MsgType {
		case "stream":
			r.stdout += c.Text
		case "execute_result":
			r.result = c.Data["text/plain"]
		case "error":
			r.ename, r.tb = c.EName, c.Traceback
		}
	})
	if err != nil {
		t.Fatalf("execute %q: %v", code, err)
	}
	r.status, r.elapsed = st, time.Since(start)
	return r
}

func TestKernelThroughExecdClient(t *testing.T) {
	k := startKernel(t)
	ctx := context.Background()

	if r := execute(t, k, ctx, "import \"fmt\"\nx := 40\nfunc add(a int) int { return x + a }"); r.status != "ok" {
		t.Fatalf("define: %+v", r)
	}
	r := execute(t, k, ctx, "fmt.Println(\"hello\", add(1))\nadd(2)")
	if r.status != "ok" || r.stdout != "hello 41\n" || r.result != "42" {
		t.Errorf("state across cells: %+v", r)
	}
	r = execute(t, k, ctx, "var m map[string]int; m[\"a\"] = 1")
	if r.status != "error" || r.ename != "panic" || len(r.tb) == 0 || !strings.Contains(r.tb[0], "nil map") {
		t.Errorf("panic: %+v", r)
	}
	r = execute(t, k, ctx, "undefinedName + 1")
	if r.status != "error" || r.ename != "CompileError" || !strings.Contains(strings.Join(r.tb, "\n"), "undefined: undefinedName") {
		t.Errorf("compile error: %+v", r)
	}

	// Streaming: each print arrives as its own message while the cell runs.
	r = execute(t, k, ctx, "import \"time\"\nfor i := 0; i < 3; i++ { fmt.Println(\"tick\", i); time.Sleep(200 * time.Millisecond) }")
	if r.stdout != "tick 0\ntick 1\ntick 2\n" || strings.Count(strings.Join(r.types, " "), "stream") != 3 {
		t.Errorf("streaming: %+v", r)
	}

	// Interrupt a busy loop; the state it changed stays, and the kernel goes on.
	go func() {
		time.Sleep(500 * time.Millisecond)
		k.Interrupt()
	}()
	r = execute(t, k, ctx, "n := 0\nfor { n++ }")
	if r.status != "error" || r.ename != "Interrupt" || r.elapsed > 10*time.Second {
		t.Errorf("interrupt: %+v", r)
	}
	if r = execute(t, k, ctx, "n > 0"); r.result != "true" {
		t.Errorf("after interrupt: %+v", r)
	}
}
