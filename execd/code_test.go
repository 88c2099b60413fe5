package execd_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/execd"
	"github.com/airlockdev/airlock/execd/execdtest"
)

func newContext(t testing.TB, base, language string) string {
	t.Helper()
	var c execd.CodeContext
	decodeInto(t, do(t, http.MethodPost, base+"/code/context", map[string]string{"language": language}), &c)
	if c.ID == "" || c.Language != language {
		t.Fatalf("created context %+v", c)
	}
	return c.ID
}

func runCode(t testing.TB, base, id, code string) []execd.Event {
	t.Helper()
	return run(t, base+"/code", execd.RunCodeRequest{Code: code, Context: &execd.CodeContext{ID: id, Language: "python"}})
}

func TestPythonContextsInSandbox(t *testing.T) {
	sb := execdtest.Start(t, execdtest.Options{})
	a, b := newContext(t, sb.URL, "python"), newContext(t, sb.URL, "python")

	evs := runCode(t, sb.URL, a, "x = 41\nprint('hello')\nx + 1")
	checkFrame(t, evs, execd.EventExecutionComplete)
	if got := texts(evs, execd.EventStdout); !equal(got, []string{"hello\n"}) {
		t.Fatalf("stdout %q", got)
	}
	var result map[string]any
	var count *int
	for _, e := range evs {
		if e.Type == execd.EventResult {
			result = e.Results
		}
		if e.Type == execd.EventExecutionCount {
			count = e.ExecutionCount
		}
	}
	if result["text"] != "42" || result["text/plain"] != nil || count == nil || *count != 1 {
		t.Fatalf("result %v count %v in %+v", result, count, evs)
	}

	evs = runCode(t, sb.URL, b, "x")
	checkFrame(t, evs, execd.EventError)
	if e := evs[len(evs)-1].Error; e.Name != "NameError" || !strings.Contains(e.Value, "'x'") || len(e.Traceback) == 0 {
		t.Fatalf("context b sees a's state: %+v", e)
	}

	evs = runCode(t, sb.URL, a, "from IPython.display import HTML, display\ndisplay(HTML('<b>hi</b>'))")
	found := false
	for _, e := range evs {
		found = found || (e.Type == execd.EventResult && e.Results["text/html"] == "<b>hi</b>")
	}
	if !found {
		t.Fatalf("display_data with text/html missing: %+v", evs)
	}

	// Interrupt a running cell by context id; the context keeps its state.
	st := openStream(t, do(t, http.MethodPost, sb.URL+"/code", execd.RunCodeRequest{Code: "import time\nprint('start', flush=True)\ntime.sleep(60)", Context: &execd.CodeContext{ID: a}}))
	for {
		ev, ok := st.next()
		if !ok {
			t.Fatal("stream ended before the cell printed")
		}
		if ev.Type == execd.EventStdout {
			break
		}
	}
	expect(t, do(t, http.MethodDelete, sb.URL+"/code?id="+a, nil), http.StatusOK)
	rest := st.all()
	if len(rest) == 0 || rest[len(rest)-1].Type != execd.EventError || rest[len(rest)-1].Error.Name != "KeyboardInterrupt" {
		t.Fatalf("after interrupt: %+v", rest)
	}
	evs = runCode(t, sb.URL, a, "x")
	if r := evs[len(evs)-2]; r.Type != execd.EventResult || r.Results["text"] != "41" {
		t.Fatalf("state lost after interrupt: %+v", evs)
	}

	// Default context: no id.
	run(t, sb.URL+"/code", execd.RunCodeRequest{Code: "y = 'default'", Context: &execd.CodeContext{Language: "python"}})
	evs = run(t, sb.URL+"/code", execd.RunCodeRequest{Code: "y"})
	if r := evs[len(evs)-2]; r.Type != execd.EventResult || r.Results["text"] != "'default'" {
		t.Fatalf("default context did not persist: %+v", evs)
	}

	// Listing, lookup, deletion.
	var list []execd.CodeContext
	decodeInto(t, do(t, http.MethodGet, sb.URL+"/code/contexts?language=python", nil), &list)
	if len(list) != 3 {
		t.Fatalf("python contexts %+v", list)
	}
	expect(t, do(t, http.MethodGet, sb.URL+"/code/contexts/"+b, nil), http.StatusOK)
	expect(t, do(t, http.MethodDelete, sb.URL+"/code/contexts/"+b, nil), http.StatusOK)
	expectError(t, do(t, http.MethodGet, sb.URL+"/code/contexts/"+b, nil), http.StatusNotFound, "NOT_FOUND")
	expectError(t, do(t, http.MethodDelete, sb.URL+"/code?id=unknown", nil), http.StatusNotFound, "NOT_FOUND")
	expect(t, do(t, http.MethodDelete, sb.URL+"/code/contexts?language=python", nil), http.StatusOK)
	decodeInto(t, do(t, http.MethodGet, sb.URL+"/code/contexts", nil), &list)
	if len(list) != 0 {
		t.Fatalf("contexts after deleting all python ones: %+v", list)
	}
}

func TestBashContextAndMissingLanguageInSandbox(t *testing.T) {
	sb := execdtest.Start(t, execdtest.Options{})
	id := newContext(t, sb.URL, "bash")
	run(t, sb.URL+"/code", execd.RunCodeRequest{Code: "X=from-bash; cd /tmp", Context: &execd.CodeContext{ID: id}})
	evs := run(t, sb.URL+"/code", execd.RunCodeRequest{Code: "echo $X $PWD", Context: &execd.CodeContext{ID: id}})
	checkFrame(t, evs, execd.EventExecutionComplete)
	if got := texts(evs, execd.EventStdout); !equal(got, []string{"from-bash /tmp"}) {
		t.Fatalf("bash context state %q", got)
	}
	expectError(t, do(t, http.MethodPost, sb.URL+"/code/context", map[string]string{"language": "java"}), http.StatusBadRequest, "UNSUPPORTED_LANGUAGE")
	expectError(t, do(t, http.MethodPost, sb.URL+"/code", execd.RunCodeRequest{Code: "1", Context: &execd.CodeContext{Language: "cobol"}}), http.StatusBadRequest, "UNSUPPORTED_LANGUAGE")
}
