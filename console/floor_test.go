package console

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestFloor: GET /console/api/floor lists the overlay's always-deny entries then the
// special-address classes, and the explain of the metadata address says it is the
// floor's, not a rule's; a name decided by a rule carries no floor note.
func TestFloor(t *testing.T) {
	h := newHarness(t, testKey)
	c := h.client()
	h.login(c, testKey)
	r, b := h.do(c, "GET", "/console/api/floor", "", nil)
	var f floorResponse
	if err := json.Unmarshal(b, &f); err != nil || r.StatusCode != 200 || len(f.Entries) < 20 ||
		f.Entries[0].Target != "169.254.169.254" || f.Entries[0].Overridable || !f.Entries[len(f.Entries)-1].Overridable {
		t.Fatalf("floor: %d %s", r.StatusCode, b)
	}
	for _, tc := range []struct{ query, floor string }{
		{"target=169.254.169.254&port=80&proto=tcp", "the platform floor denies this (169.254.169.254, built-in"},
		{"target=10.1.2.3&port=80&proto=tcp", "a special address"},
		{"target=pypi.org&port=443&proto=tcp", ""},
	} {
		r, b := h.do(c, "GET", "/console/api/sandboxes/sb1/explain?"+tc.query, "", nil)
		var x explainResponse
		if err := json.Unmarshal(b, &x); err != nil || r.StatusCode != 200 || !strings.HasPrefix(x.Floor, tc.floor) || (tc.floor == "") != (x.Floor == "") {
			t.Errorf("%s: %d floor %q, want %q", tc.query, r.StatusCode, x.Floor, tc.floor)
		}
	}
}
