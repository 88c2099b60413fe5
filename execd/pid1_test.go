package execd_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/airlockdev/airlock/execd"
	"github.com/airlockdev/airlock/execd/execdtest"
	"github.com/airlockdev/airlock/internal/testenv"
)

// noShellImage imports an image holding only /bin/pid1child and an empty /tmp: no
// shell, no libc, nothing else. It is removed when the test ends.
func noShellImage(t *testing.T) string {
	t.Helper()
	testenv.NeedDocker(t)
	bin := execdtest.BuildGo(t, "./execd/testdata/pid1child", t.TempDir())
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "bin/", Mode: 0o755})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/pid1child", Mode: 0o755, Size: int64(len(data))})
	tw.Write(data)
	tw.Close()

	docker, err := client.New(client.FromEnv)
	if err != nil {
		t.Fatal(err)
	}
	defer docker.Close()
	ref := strings.ToLower(execdtest.UniqueName("airlock-execdtest-noshell")) + ":test"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := docker.ImageImport(ctx, client.ImageImportSource{Source: &buf, SourceName: "-"}, ref, client.ImageImportOptions{})
	if err != nil {
		t.Fatalf("importing the no-shell image: %v", err)
	}
	io.Copy(io.Discard, res)
	res.Close()
	t.Cleanup(func() {
		docker, err := client.New(client.FromEnv)
		if err != nil {
			return
		}
		defer docker.Close()
		docker.ImageRemove(context.Background(), ref, client.ImageRemoveOptions{Force: true, PruneChildren: true})
	})
	return ref
}

// TestPID1WithoutShell runs execd as PID 1 in an image with no shell: the API serves,
// commands fail with a clear error, orphans are reaped, SIGTERM reaches the child and
// the container exits with the child's status.
func TestPID1WithoutShell(t *testing.T) {
	img := noShellImage(t)
	sb := execdtest.Start(t, execdtest.Options{Image: img, Cmd: []string{"/bin/pid1child"}})

	expectError(t, do(t, http.MethodPost, sb.URL+"/command", execd.RunCommandRequest{Command: "true"}), http.StatusNotImplemented, "NOT_AVAILABLE")
	expectError(t, do(t, http.MethodPost, sb.URL+"/code/context", map[string]string{"language": "python"}), http.StatusBadRequest, "UNSUPPORTED_LANGUAGE")
	var list []execd.FileInfo
	decodeInto(t, do(t, http.MethodGet, sb.URL+"/directories/list?path=/bin", nil), &list)
	if len(list) != 1 || list[0].Path != "/bin/pid1child" {
		t.Fatalf("the image holds %+v", list)
	}

	// The child left three orphans; once they exit, PID 1 (execd) must reap them.
	var pids []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp := do(t, http.MethodGet, sb.URL+"/files/download?path=/tmp/orphans", nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			pids = strings.Fields(string(b))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child never wrote /tmp/orphans (logs: %s)", sb.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(pids) != 3 {
		t.Fatalf("orphan pids %q", pids)
	}
	for _, pid := range pids {
		for {
			resp := do(t, http.MethodGet, sb.URL+"/files/info?path=/proc/"+pid, nil)
			resp.Body.Close()
			if resp.StatusCode == http.StatusNotFound {
				break // reaped: no /proc entry, not even a zombie
			}
			if time.Now().After(deadline) {
				stat := expect(t, do(t, http.MethodGet, sb.URL+"/files/download?path=/proc/"+pid+"/stat", nil), http.StatusOK)
				t.Fatalf("orphan %s was never reaped: %s", pid, stat)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// docker stop sends SIGTERM to PID 1; the child answers with exit status 42.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	timeout := 20
	if _, err := sb.Docker.ContainerStop(ctx, sb.ID, client.ContainerStopOptions{Timeout: &timeout}); err != nil {
		t.Fatalf("stopping: %v", err)
	}
	insp, err := sb.Docker.ContainerInspect(ctx, sb.ID, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st := insp.Container.State; st.Running || st.ExitCode != 42 {
		t.Fatalf("container state after stop: running=%v exit=%d (logs: %s)", st.Running, st.ExitCode, sb.Logs())
	}
	if !strings.Contains(sb.Logs(), "SIGTERM received") {
		t.Fatalf("the child never saw SIGTERM: %s", sb.Logs())
	}
}
