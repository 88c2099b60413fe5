package execd_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"github.com/airlockdev/airlock/execd"
	"github.com/airlockdev/airlock/execd/execdtest"
	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/testenv"
)

// dockerExec runs cmd in the container through the Engine API (create, attach-start,
// inspect), feeding stdin when given, and returns stdout.
func dockerExec(ctx context.Context, docker *client.Client, id string, stdin []byte, cmd ...string) ([]byte, error) {
	ex, err := docker.ExecCreate(ctx, id, client.ExecCreateOptions{Cmd: cmd, AttachStdout: true, AttachStderr: true, AttachStdin: stdin != nil})
	if err != nil {
		return nil, err
	}
	att, err := docker.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		return nil, err
	}
	defer att.Close()
	if stdin != nil {
		go func() {
			att.Conn.Write(stdin)
			att.CloseWrite()
		}()
	}
	var out, errOut bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &errOut, att.Reader); err != nil {
		return nil, err
	}
	insp, err := docker.ExecInspect(ctx, ex.ID, client.ExecInspectOptions{})
	if err != nil {
		return nil, err
	}
	if insp.ExitCode != 0 {
		return nil, fmt.Errorf("docker exec %v: exit %d: %s", cmd, insp.ExitCode, errOut.String())
	}
	return out.Bytes(), nil
}

// TestBenchExecd measures execd against `docker exec` (through the Engine API) on the
// same container in the same run: `echo hi` round trip latency, and 1 MiB upload and
// download. Ratios above 1 mean execd is faster.
func TestBenchExecd(t *testing.T) {
	testenv.NeedBench(t)
	sb := execdtest.Start(t, execdtest.Options{})
	ctx := context.Background()
	const suite = "execd"

	echoExecd := func() error {
		resp := do(t, http.MethodPost, sb.URL+"/command", execd.RunCommandRequest{Command: "echo hi"})
		evs := openStream(t, resp).all()
		if out := texts(evs, execd.EventStdout); len(out) != 1 || out[0] != "hi" {
			return fmt.Errorf("echo through execd: %+v", evs)
		}
		return nil
	}
	echoDocker := func() error {
		out, err := dockerExec(ctx, sb.Docker, sb.ID, nil, "bash", "-c", "echo hi")
		if err == nil && string(out) != "hi\n" {
			err = fmt.Errorf("echo through docker exec: %q", out)
		}
		return err
	}
	for range 10 { // warm both paths
		echoExecd()
		echoDocker()
	}
	const n = 200
	e, err := benchreport.Measure("command_echo_execd", n, echoExecd)
	if err != nil {
		t.Fatal(err)
	}
	d, err := benchreport.Measure("command_echo_docker_exec", n, echoDocker)
	if err != nil {
		t.Fatal(err)
	}
	benchreport.Print(suite, e)
	benchreport.Print(suite, d)
	benchreport.Ratio(suite, "echo_p50_docker_exec_over_execd", ratio(d.Quantile(0.5), e.Quantile(0.5)), "≥", 1)
	benchreport.Ratio(suite, "echo_p99_docker_exec_over_execd", ratio(d.Quantile(0.99), e.Quantile(0.99)), "≥", 1)

	data := make([]byte, 1<<20)
	rand.Read(data)
	const path = "/workspace/bench.bin"
	upExecd := func() error {
		return statusOK(upload(t, sb.URL, execd.FileMetadata{Path: path}, data))
	}
	upDocker := func() error {
		_, err := dockerExec(ctx, sb.Docker, sb.ID, data, "sh", "-c", "cat > /workspace/bench-docker.bin")
		return err
	}
	downExecd := func() error {
		resp := do(t, http.MethodGet, sb.URL+"/files/download?path="+path, nil)
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		if err == nil && (resp.StatusCode != http.StatusOK || len(got) != len(data)) {
			err = fmt.Errorf("download: status %d, %d bytes", resp.StatusCode, len(got))
		}
		return err
	}
	downDocker := func() error {
		out, err := dockerExec(ctx, sb.Docker, sb.ID, nil, "cat", "/workspace/bench-docker.bin")
		if err == nil && len(out) != len(data) {
			err = fmt.Errorf("docker exec cat: %d bytes", len(out))
		}
		return err
	}
	const m = 50
	for _, pair := range []struct {
		what            string
		execd, docker   func() error
		execdN, dockerN string
	}{
		{"upload_1MiB", upExecd, upDocker, "upload_1MiB_execd", "upload_1MiB_docker_exec"},
		{"download_1MiB", downExecd, downDocker, "download_1MiB_execd", "download_1MiB_docker_exec"},
	} {
		pair.execd()
		pair.docker()
		e, err := benchreport.Measure(pair.execdN, m, pair.execd)
		if err != nil {
			t.Fatal(err)
		}
		d, err := benchreport.Measure(pair.dockerN, m, pair.docker)
		if err != nil {
			t.Fatal(err)
		}
		benchreport.Print(suite, e)
		benchreport.Print(suite, d)
		benchreport.Value(suite, pair.what+"_throughput", "execd %.1f MiB/s, docker exec %.1f MiB/s", e.Rate(), d.Rate())
		benchreport.Ratio(suite, pair.what+"_throughput_execd_over_docker_exec", e.Rate()/d.Rate(), "≥", 1)
	}
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func statusOK(resp *http.Response) error {
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}
