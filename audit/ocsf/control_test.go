package ocsf

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
)

// TestControlRecordsAsAPIActivity: control-plane records (source control) come out
// as API Activity naming the principal as actor.user, the op, the target and the
// answer's status, a refusal as Failure; and one changed field in such an event makes
// the schema validator fail (the mutations of TestValidatorCatchesMutations, for the
// control event rather than the first 6003 event, which is a vault change).
func TestControlRecordsAsAPIActivity(t *testing.T) {
	events, _ := readEvents(t, writeLog(t, records(), 0))
	s := testSchema(t)
	var control []map[string]any
	for _, ev := range events {
		if ev["metadata"].(map[string]any)["event_code"] == "control" && ev["class_uid"] == float64(ClassAPIActivity) {
			control = append(control, ev)
		}
	}
	if len(control) != 4 {
		t.Fatalf("%d control events, want 4", len(control))
	}
	for i, want := range []struct {
		class, activity, status int
		user, op, resource      string
	}{
		{ClassAPIActivity, 1, statusSuccess, "admin", "sandbox.create", "sb3"},
		{ClassAPIActivity, 1, statusSuccess, "admin", "key.create", "pk_123"},
		{ClassAPIActivity, 4, statusFail, "pk_u2", "sandbox.delete", "sb1"},
		{ClassAPIActivity, 2, statusFail, "", "api.read", ""},
	} {
		ev := control[i]
		if errs := s.validateEvent(ev, classNamesByUID); len(errs) > 0 {
			t.Errorf("control event %d invalid: %v", i, errs)
		}
		got := fmt.Sprint(ev["class_uid"], ev["activity_id"], ev["status_id"])
		if got != fmt.Sprint(want.class, want.activity, want.status) {
			t.Errorf("control event %d: class, activity, status %s, want %d %d %d", i, got, want.class, want.activity, want.status)
		}
		actor := ev["actor"].(map[string]any)
		if u, _ := actor["user"].(map[string]any); fmt.Sprint(u["uid"]) != want.user && !(want.user == "" && u == nil) {
			t.Errorf("control event %d: actor %v, want user %q", i, actor, want.user)
		}
		if op := ev["api"].(map[string]any)["operation"]; op != want.op {
			t.Errorf("control event %d: api.operation %v, want %s", i, op, want.op)
		}
		if want.resource != "" && !strings.Contains(fmt.Sprint(ev["resources"]), want.resource) {
			t.Errorf("control event %d: resources %v lack %s", i, ev["resources"], want.resource)
		}
	}
	obj := func(ev map[string]any, k string) map[string]any { return ev[k].(map[string]any) }
	for _, tc := range []struct {
		name   string
		mutate func(ev map[string]any)
		want   string
	}{
		{"actor missing", func(ev map[string]any) { delete(ev, "actor") }, "actor: required"},
		{"actor empty", func(ev map[string]any) { ev["actor"] = map[string]any{} }, "constraint at_least_one"},
		{"user type_id not in the enum", func(ev map[string]any) { obj(obj(ev, "actor"), "user")["type_id"] = 7.0 }, "type_id: 7"},
		{"api.operation missing", func(ev map[string]any) { delete(obj(ev, "api"), "operation") }, "operation: required"},
		{"src_endpoint missing", func(ev map[string]any) { delete(ev, "src_endpoint") }, "src_endpoint: required"},
		{"activity_id not in the enum", func(ev map[string]any) { ev["activity_id"] = 5.0; ev["type_uid"] = 600305.0 }, "activity_id: 5"},
		{"http_response code a string", func(ev map[string]any) { obj(ev, "http_response")["code"] = "202" }, "want an integer"},
		{"resources not an array", func(ev map[string]any) { ev["resources"] = map[string]any{"uid": "sb3"} }, "want an array"},
		{"url without path", func(ev map[string]any) { delete(obj(obj(ev, "http_request"), "url"), "path") }, "constraint at_least_one"},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			ev := deepCopy(t, control[0])
			tc.mutate(ev)
			errs := s.validateEvent(ev, classNamesByUID)
			if len(errs) == 0 {
				t.Fatalf("mutation %q passes the validator", tc.name)
			}
			if !strings.Contains(fmt.Sprint(errs), tc.want) {
				t.Errorf("mutation %q: errors %v, want one with %q", tc.name, errs, tc.want)
			}
		})
	}
}

// TestPolicyChangeIsOneAPIActivity: a policy change made through the API is a policy
// record (Device Config State Change) and a control record (API Activity naming the
// principal); the policy record adds no API Activity of its own, so a SIEM counts one
// API call once.
func TestPolicyChangeIsOneAPIActivity(t *testing.T) {
	recs := []audit.Record{
		{Time: time.Now(), SandboxID: "sb1", Source: audit.SourcePolicy, Src: "127.0.0.1:50003", Action: "allow",
			Reason: "policy changed: put", PolicyVersion: 3, Extra: map[string]any{"change": "put", "route": "PUT /v1/sandboxes/sb1/policy"}},
		{Time: time.Now(), SandboxID: "sb1", Source: audit.SourceControl, Src: "127.0.0.1:50003", Action: "allow",
			Extra: map[string]any{"op": "policy.put", "principal": "admin", "status": 200, "method": "PUT",
				"path": "/v1/sandboxes/sb1/policy", "target_type": "sandbox", "target": "sb1"}},
	}
	events, _ := readEvents(t, writeLog(t, recs, 0))
	classes := map[any]int{}
	for _, ev := range events {
		classes[ev["class_uid"]]++
	}
	if len(events) != 2 || classes[float64(ClassDeviceConfigState)] != 1 || classes[float64(ClassAPIActivity)] != 1 {
		t.Fatalf("events by class %v for one policy change through the API; want one 5019 and one 6003", classes)
	}
}

// TestSignInsAsAuthentication: console sign-ins and sign-outs (control records of op
// console.sign_*) come out as Authentication: a failed sign-in is a Logon with status
// Failure, user "unknown" and the reason; a sign-out a Logoff naming the principal.
func TestSignInsAsAuthentication(t *testing.T) {
	events, _ := readEvents(t, writeLog(t, records(), 0))
	s := testSchema(t)
	var auth []map[string]any
	for _, ev := range events {
		if ev["class_uid"] == float64(ClassAuthentication) {
			auth = append(auth, ev)
		}
	}
	if len(auth) != 2 {
		t.Fatalf("%d Authentication events, want 2", len(auth))
	}
	for i, want := range []struct {
		activity, status int
		user, detail     string
	}{
		{1, statusFail, "unknown", "sign-in failed: wrong API key"},
		{2, statusSuccess, "pk_1", ""},
	} {
		ev := auth[i]
		if errs := s.validateEvent(ev, classNamesByUID); len(errs) > 0 {
			t.Errorf("authentication event %d invalid: %v", i, errs)
		}
		if got := fmt.Sprint(ev["activity_id"], ev["status_id"]); got != fmt.Sprint(want.activity, want.status) {
			t.Errorf("authentication event %d: activity, status %s, want %d %d", i, got, want.activity, want.status)
		}
		u := ev["user"].(map[string]any)
		if u["uid"] != want.user && u["name"] != want.user {
			t.Errorf("authentication event %d: user %v, want %s", i, u, want.user)
		}
		if d, _ := ev["status_detail"].(string); d != want.detail {
			t.Errorf("authentication event %d: status_detail %q, want %q", i, d, want.detail)
		}
	}
}
