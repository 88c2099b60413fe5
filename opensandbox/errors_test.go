package opensandbox

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

func TestWriteError(t *testing.T) {
	rec := httptest.NewRecorder()
	rec.Header().Set("Retry-After", "3")
	WriteError(rec, http.StatusNotFound, ErrorBody{Code: "SANDBOX_NOT_FOUND", Message: "sandbox not found", RequestID: "r1"})
	if rec.Code != http.StatusNotFound {
		t.Fatalf("status %d, want 404", rec.Code)
	}
	h := rec.Header()
	if h.Get("Content-Type") != "application/json" || h.Get("Cache-Control") != "no-store" || h.Get("Retry-After") != "3" {
		t.Fatalf("headers %v", h)
	}
	if h.Get("Content-Length") != strconv.Itoa(rec.Body.Len()) {
		t.Fatalf("Content-Length %s, body %d bytes", h.Get("Content-Length"), rec.Body.Len())
	}
	var got ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got != (ErrorBody{"SANDBOX_NOT_FOUND", "sandbox not found", "r1"}) {
		t.Fatalf("body %+v", got)
	}
}

func TestWriteJSONUnencodable(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteJSON(rec, http.StatusOK, map[string]any{"f": func() {}})
	var got ErrorBody
	if rec.Code != http.StatusInternalServerError || json.Unmarshal(rec.Body.Bytes(), &got) != nil || got.Code != "INTERNAL_ERROR" {
		t.Fatalf("status %d body %q", rec.Code, rec.Body.String())
	}
}

func TestControlPorts(t *testing.T) {
	for port, want := range map[int]bool{ExecdPort: true, EgressAPIPort: true, CDPPort: true, VNCPort: true, NoVNCPort: true, 8080: false, 5901: false, 0: false} {
		if IsControlPort(port) != want {
			t.Errorf("IsControlPort(%d) = %v", port, !want)
		}
	}
	for i, p := range ControlPorts {
		if !IsControlPort(p) || (i > 0 && ControlPorts[i-1] >= p) {
			t.Errorf("ControlPorts = %v: not ascending control ports", ControlPorts)
		}
	}
}
