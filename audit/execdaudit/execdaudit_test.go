package execdaudit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit/record"
	"github.com/airlockdev/airlock/execd"
	"github.com/airlockdev/airlock/principal"
)

type sink struct {
	mu   sync.Mutex
	recs []record.Record
}

func (s *sink) Append(r record.Record) {
	s.mu.Lock()
	s.recs = append(s.recs, r)
	s.mu.Unlock()
}

// take returns the records appended so far, after waiting up to a second for n of
// them (the proxy finishes an action just after the client has its answer).
func (s *sink) take(n int) []record.Record {
	for i := 0; i < 100; i++ {
		s.mu.Lock()
		l := len(s.recs)
		s.mu.Unlock()
		if l >= n {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.recs
	s.recs = nil
	return out
}

// proxyFront is a real execd (in process, running commands on this host) behind a
// reverse proxy that records agent actions as lifecycle's server proxy does.
func proxyFront(t *testing.T, cfg Config) (string, *sink, string) {
	t.Helper()
	return proxyFrontInfo(t, cfg, nil)
}

// proxyFrontInfo is proxyFront with the Info of each request changed by info (nil: as
// is).
func proxyFrontInfo(t *testing.T, cfg Config, info func(*Info)) (string, *sink, string) {
	t.Helper()
	work := t.TempDir()
	srv, err := execd.New(execd.Config{Addr: "127.0.0.1:0", Workdir: work})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	up := httptest.NewServer(srv.Handler())
	t.Cleanup(up.Close)
	base, s := proxyTo(t, up.URL, cfg, info)
	return base, s, work
}

// proxyTo is the recording reverse proxy of proxyFrontInfo in front of the execd at
// upstream (a URL).
func proxyTo(t *testing.T, upstream string, cfg Config, info func(*Info)) (string, *sink) {
	t.Helper()
	u, _ := url.Parse(upstream)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	s := &sink{}
	obs := New(s, cfg, "server_proxy")
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// As lifecycle's server proxy: execd answers before the body is all read.
		_ = http.NewResponseController(w).EnableFullDuplex()
		r = r.WithContext(principal.NewContext(r.Context(), principal.Principal{ID: "alice", Role: principal.User}))
		in := Info{SandboxID: "sb1", RequestID: "req-1", Client: r.RemoteAddr}
		if info != nil {
			info(&in)
		}
		a := obs.Start(r, r.URL.Path, in)
		if a != nil {
			w = a.Writer(w)
			defer a.Finish(0)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	return front.URL, s
}

func post(t *testing.T, u, ctype string, body []byte) string {
	t.Helper()
	resp, err := http.Post(u, ctype, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		t.Fatalf("POST %s: %d %s", u, resp.StatusCode, b)
	}
	return string(b)
}

func do(t *testing.T, method, u string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), method, u, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

func one(t *testing.T, s *sink, op string) record.Record {
	t.Helper()
	recs := s.take(1)
	if len(recs) != 1 || recs[0].Extra["op"] != op {
		t.Fatalf("want one %s record, got %+v", op, recs)
	}
	r := recs[0]
	if r.Source != record.SourceExecd || r.SandboxID != "sb1" || r.Extra["request_id"] != "req-1" ||
		r.Extra["principal"] != "alice" || r.Extra["entry"] != "server_proxy" {
		t.Errorf("record %+v: want source execd, sandbox sb1, request id, principal, entry", r)
	}
	return r
}

// TestCommandsAndFiles: commands (exit code, text, duration), a failing command, a
// session, and file operations through a proxy with an Observer.
func TestCommandsAndFiles(t *testing.T) {
	base, s, work := proxyFront(t, Config{})

	out := post(t, base+"/command", "application/json", []byte(`{"command":"echo hello"}`))
	if !strings.Contains(out, "hello") {
		t.Fatalf("stream %q", out)
	}
	r := one(t, s, "command")
	if r.Extra["command"] != "echo hello" || r.Extra["exit_code"] != 0 || r.Extra["outcome"] != "success" ||
		r.Extra["command_id"] == nil || r.Extra["execution_ms"] == nil || r.Extra["status"] != 200 {
		t.Errorf("command record %+v", r.Extra)
	}
	if d, _ := r.Extra["duration_ms"].(float64); d <= 0 {
		t.Errorf("duration_ms %v", r.Extra["duration_ms"])
	}

	post(t, base+"/command", "application/json", []byte(`{"command":"exit 3"}`))
	r = one(t, s, "command")
	if r.Extra["exit_code"] != 3 || r.Extra["outcome"] != "failure" || r.Extra["error"] != "CommandExecError" {
		t.Errorf("failed command record %+v", r.Extra)
	}

	sess := post(t, base+"/session", "application/json", []byte(`{}`))
	var sr struct {
		SessionID string `json:"session_id"`
	}
	json.Unmarshal([]byte(sess), &sr)
	if r = one(t, s, "session.create"); r.Extra["session_id"] != sr.SessionID || sr.SessionID == "" {
		t.Errorf("session.create %+v, want %q", r.Extra, sr.SessionID)
	}
	post(t, base+"/session/"+sr.SessionID+"/run", "application/json", []byte(`{"command":"X=1; echo $X"}`))
	if r = one(t, s, "session.run"); r.Extra["command"] != "X=1; echo $X" || r.Extra["session_id"] != sr.SessionID || r.Extra["exit_code"] != 0 {
		t.Errorf("session.run %+v", r.Extra)
	}
	do(t, http.MethodDelete, base+"/session/"+sr.SessionID)
	if r = one(t, s, "session.close"); r.Extra["session_id"] != sr.SessionID || r.Extra["outcome"] != "success" {
		t.Errorf("session.close %+v", r.Extra)
	}

	// Upload: path, size and the SHA-256 of what went through.
	content := bytes.Repeat([]byte("airlock "), 100000)
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	mp, _ := mw.CreateFormField("metadata")
	mp.Write([]byte(`{"path":"up/a.bin","mode":644}`))
	fp, _ := mw.CreateFormFile("file", "a.bin")
	fp.Write(content)
	mw.Close()
	post(t, base+"/files/upload", mw.FormDataContentType(), body.Bytes())
	sum := sha256.Sum256(content)
	r = one(t, s, "file.upload")
	if r.Extra["path"] != "up/a.bin" || r.Extra["size"] != int64(len(content)) || r.Extra["sha256"] != hex.EncodeToString(sum[:]) ||
		r.Extra["mode"] != "644" || r.Extra["outcome"] != "success" {
		t.Errorf("upload record %+v", r.Extra)
	}
	if got, _ := os.ReadFile(filepath.Join(work, "up/a.bin")); !bytes.Equal(got, content) {
		t.Fatalf("the proxied upload wrote %d bytes, want %d", len(got), len(content))
	}

	post(t, base+"/files/mv", "application/json", []byte(`[{"src":"up/a.bin","dest":"up/b.bin"}]`))
	if r = one(t, s, "file.move"); r.Extra["path"] != "up/a.bin" || r.Extra["dest"] != "up/b.bin" {
		t.Errorf("move %+v", r.Extra)
	}
	post(t, base+"/files/permissions", "application/json", []byte(`{"up/b.bin":{"mode":600}}`))
	if r = one(t, s, "file.chmod"); r.Extra["path"] != "up/b.bin" || r.Extra["mode"] != "600" {
		t.Errorf("chmod %+v", r.Extra)
	}
	do(t, http.MethodDelete, base+"/files?path=up/b.bin&path=up/missing")
	recs := s.take(2)
	if len(recs) != 2 || recs[0].Extra["path"] != "up/b.bin" || recs[1].Extra["path"] != "up/missing" ||
		recs[0].Extra["outcome"] != "failure" || recs[0].Extra["status"] != 404 {
		t.Errorf("delete of two paths, one missing (404): %+v", recs)
	}
	// Reads are not recorded.
	do(t, http.MethodGet, base+"/files/info?path=up")
	do(t, http.MethodGet, base+"/ping")
	time.Sleep(50 * time.Millisecond)
	if recs := s.take(0); len(recs) != 0 {
		t.Errorf("reads recorded: %+v", recs)
	}
}

// TestHashCommands: with HashCommands a record keeps the command's SHA-256 and not
// its text, anywhere.
func TestHashCommands(t *testing.T) {
	base, s, _ := proxyFront(t, Config{HashCommands: true})
	const cmd = "echo secret-token-value"
	post(t, base+"/command", "application/json", []byte(`{"command":"`+cmd+`"}`))
	r := one(t, s, "command")
	sum := sha256.Sum256([]byte(cmd))
	b, _ := r.Canonical()
	if r.Extra["command_sha256"] != hex.EncodeToString(sum[:]) || strings.Contains(string(b), "secret-token") {
		t.Errorf("hashed record %s", b)
	}
}

// TestStreamEvents: the event scan finds init, execution_complete and error lines
// however the stream is cut into writes, and ignores long output lines.
func TestStreamEvents(t *testing.T) {
	stream := `{"type":"init","text":"cmd-7","timestamp":1}` + "\n\n" +
		`{"type":"stdout","text":"` + strings.Repeat("x", 100000) + `","timestamp":2}` + "\n\n" +
		`{"type":"stdout","text":"{\"type\":\"error\"}","timestamp":2}` + "\n\n" +
		`{"type":"error","error":{"ename":"CommandExecError","evalue":"-1","traceback":["signal: killed"]},"timestamp":3}` + "\n\n"
	for _, step := range []int{1, 7, 4096, len(stream)} {
		a := &Action{stream: true, op: opCommand}
		for i := 0; i < len(stream); i += step {
			a.Write([]byte(stream[i:min(i+step, len(stream))]))
		}
		if code, ok := a.exitCode(); a.commandID != "cmd-7" || !ok || code != -1 {
			t.Errorf("step %d: id %q, exit %d %v", step, a.commandID, code, ok)
		}
	}
}
