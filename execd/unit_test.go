package execd

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
)

func TestParseRange(t *testing.T) {
	cases := []struct {
		name, header string
		want         ByteRange
		ok           bool
		err          error
	}{
		{"none", "", ByteRange{}, false, nil},
		{"closed", "bytes=2-4", ByteRange{2, 3}, true, nil},
		{"open", "bytes=7-", ByteRange{7, 3}, true, nil},
		{"suffix", "bytes=-4", ByteRange{6, 4}, true, nil},
		{"suffix_longer_than_file", "bytes=-40", ByteRange{0, 10}, true, nil},
		{"end_past_file", "bytes=8-100", ByteRange{8, 2}, true, nil},
		{"start_past_file", "bytes=10-", ByteRange{}, false, ErrRange},
		{"reversed", "bytes=5-2", ByteRange{}, false, ErrInvalid},
		{"multi", "bytes=0-1,3-4", ByteRange{}, false, ErrInvalid},
		{"unit", "lines=0-1", ByteRange{}, false, ErrInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok, err := ParseRange(c.header, 10)
			if got != c.want || ok != c.ok || (c.err == nil) != (err == nil) || (c.err != nil && !strings.Contains(err.Error(), "range")) {
				t.Fatalf("ParseRange(%q) = %+v %v %v", c.header, got, ok, err)
			}
		})
	}
}

func TestModeRoundTrip(t *testing.T) {
	for dec, oct := range map[int]uint32{755: 0o755, 644: 0o644, 4755: 0o4755, 0: 0} {
		if v, err := ParseMode(dec); err != nil || v != oct || FormatMode(oct) != dec {
			t.Fatalf("mode %d: %o %v", dec, v, err)
		}
	}
	for _, bad := range []int{8, 79, 1000000, -1} {
		if _, err := ParseMode(bad); err == nil {
			t.Fatalf("ParseMode(%d) accepted", bad)
		}
	}
}

// TestServerInProcess runs the handler on the host (no container): the routes are
// registered without conflicts and a command streams.
func TestServerInProcess(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash on this host")
	}
	s, err := New(Config{Workdir: t.TempDir(), StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	resp, err := http.Post(ts.URL+"/command", "application/json", strings.NewReader(`{"command":"echo in-process; pwd"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"text":"in-process"`) || !strings.Contains(string(b), `"type":"execution_complete"`) {
		t.Fatalf("stream %s", b)
	}
	if _, err := New(Config{Workdir: "relative"}); err == nil {
		t.Fatal("relative workdir accepted")
	}
}

func TestStderrError(t *testing.T) {
	cases := []struct {
		name, stderr, ename, evalue string
	}{
		{"node_stack", "evalmachine.<anonymous>:2\nthrow new TypeError(\"boom\");\n^\n\nTypeError: boom\n    at evalmachine.<anonymous>:2:7\n", "TypeError", "boom"},
		{"plain_error", "Error: Script execution was interrupted by `SIGINT`\n    at sigintHandlersWrap (node:vm:260:12)\n", "Error", "Script execution was interrupted by `SIGINT`"},
		{"diagnostic", "1:7 - Type 'string' is not assignable to type 'number'.\n", "Error", "1:7 - Type 'string' is not assignable to type 'number'."},
		{"nothing", "", "Error", "the cell failed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := stderrError(tc.stderr)
			if e.Name != tc.ename || e.Value != tc.evalue || (tc.stderr != "" && len(e.Traceback) == 0) {
				t.Errorf("stderrError(%q) = %+v", tc.stderr, e)
			}
		})
	}
}
