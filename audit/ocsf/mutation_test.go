package ocsf

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/audit"
)

// TestValidatorCatchesMutations: one changed field in a valid event (a missing
// required attribute, a wrong type, an enum id not in the schema, a type_uid that is
// not class_uid*100+activity_id, an undeclared profile, ...) makes the validator fail,
// so TestExportValidatesAgainstSchema can fail.
func TestValidatorCatchesMutations(t *testing.T) {
	events, _ := readEvents(t, writeLog(t, records(), 0))
	s := testSchema(t)
	// the first event of each class, by class_uid
	byClass := map[int]map[string]any{}
	for _, ev := range events {
		uid, _ := intOf(ev["class_uid"])
		if _, ok := byClass[int(uid)]; !ok {
			byClass[int(uid)] = ev
		}
	}
	obj := func(ev map[string]any, k string) map[string]any { return ev[k].(map[string]any) }
	for _, tc := range []struct {
		class  int
		name   string
		mutate func(ev map[string]any)
		want   string // a word of the expected error
	}{
		{ClassNetworkActivity, "time missing", func(ev map[string]any) { delete(ev, "time") }, "time: required"},
		{ClassNetworkActivity, "time a string", func(ev map[string]any) { ev["time"] = "yesterday" }, "want an integer"},
		{ClassNetworkActivity, "time a fraction", func(ev map[string]any) { ev["time"] = 1.5 }, "want an integer"},
		{ClassNetworkActivity, "metadata.product missing", func(ev map[string]any) { delete(obj(ev, "metadata"), "product") }, "product: required"},
		{ClassNetworkActivity, "metadata.version missing", func(ev map[string]any) { delete(obj(ev, "metadata"), "version") }, "version: required"},
		{ClassNetworkActivity, "activity_id not in the enum", func(ev map[string]any) { ev["activity_id"] = 42.0 }, "activity_id: 42 is not in its enum"},
		{ClassNetworkActivity, "type_uid off by one", func(ev map[string]any) { ev["type_uid"] = ev["type_uid"].(float64) + 1 }, "type_uid"},
		{ClassNetworkActivity, "category_uid wrong", func(ev map[string]any) { ev["category_uid"] = 1.0 }, "category_uid"},
		{ClassNetworkActivity, "class_uid unknown", func(ev map[string]any) { ev["class_uid"] = 4999.0 }, "not a class"},
		{ClassNetworkActivity, "severity_id not in the enum", func(ev map[string]any) { ev["severity_id"] = 7.0 }, "severity_id: 7"},
		{ClassNetworkActivity, "severity not its caption", func(ev map[string]any) { ev["severity"] = "Critical" }, "caption of severity_id"},
		{ClassNetworkActivity, "status_id not in the enum", func(ev map[string]any) { ev["status_id"] = 5.0 }, "status_id: 5"},
		{ClassNetworkActivity, "action_id not in the enum", func(ev map[string]any) { ev["action_id"] = 9.0 }, "action_id: 9"},
		{ClassNetworkActivity, "profile not declared", func(ev map[string]any) { delete(obj(ev, "metadata"), "profiles") }, "profile security_control"},
		{ClassNetworkActivity, "undeclared attribute", func(ev map[string]any) { ev["sandbox_id"] = "sb1" }, "sandbox_id: not an attribute"},
		{ClassNetworkActivity, "port out of range", func(ev map[string]any) { obj(ev, "dst_endpoint")["port"] = 70000.0 }, "out of range"},
		{ClassNetworkActivity, "ip not an address", func(ev map[string]any) { obj(ev, "dst_endpoint")["ip"] = "pypi.org" }, "not an IP"},
		{ClassNetworkActivity, "endpoint empty", func(ev map[string]any) { ev["dst_endpoint"] = map[string]any{} }, "constraint at_least_one"},
		{ClassNetworkActivity, "actor.process without pid", func(ev map[string]any) { delete(obj(obj(ev, "actor"), "process"), "pid") }, "constraint at_least_one"},
		{ClassNetworkActivity, "host profile not declared", func(ev map[string]any) { obj(ev, "metadata")["profiles"] = []any{"security_control"} }, "not in metadata.profiles"},
		{ClassNetworkActivity, "actor.process.pid a string", func(ev map[string]any) { obj(obj(ev, "actor"), "process")["pid"] = "4242" }, "want an integer"},
		{ClassNetworkActivity, "connection direction missing", func(ev map[string]any) { delete(obj(ev, "connection_info"), "direction_id") }, "direction_id: required"},
		{ClassDNSActivity, "answers not an array", func(ev map[string]any) { ev["answers"] = map[string]any{"rdata": "1.2.3.4"} }, "want an array"},
		{ClassDNSActivity, "query without hostname", func(ev map[string]any) { delete(obj(ev, "query"), "hostname") }, "hostname: required"},
		{ClassDNSActivity, "rcode_id not in the enum", func(ev map[string]any) { ev["rcode_id"] = 12.0 }, "rcode_id: 12"},
		{ClassHTTPActivity, "http_method not in the enum", func(ev map[string]any) { obj(ev, "http_request")["http_method"] = "FETCH" }, "http_method: FETCH"},
		{ClassHTTPActivity, "no request, no response", func(ev map[string]any) { delete(ev, "http_request"); delete(ev, "http_response") }, "constraint"},
		{ClassAPIActivity, "api.operation missing", func(ev map[string]any) { delete(obj(ev, "api"), "operation") }, "operation: required"},
		{ClassAPIActivity, "actor missing", func(ev map[string]any) { delete(ev, "actor") }, "actor: required"},
		{ClassDeviceConfigState, "device type_id missing", func(ev map[string]any) { delete(obj(ev, "device"), "type_id") }, "type_id: required"},
		{ClassEventLog, "count a string", func(ev map[string]any) { ev["count"] = "7" }, "want an integer"},
		{ClassProcessActivity, "process missing", func(ev map[string]any) { delete(ev, "process") }, "process: required"},
		{ClassProcessActivity, "process empty", func(ev map[string]any) { ev["process"] = map[string]any{} }, "constraint at_least_one"},
		{ClassProcessActivity, "exit_code a string", func(ev map[string]any) { ev["exit_code"] = "0" }, "want an integer"},
		{ClassProcessActivity, "device missing", func(ev map[string]any) { delete(ev, "device") }, "device: required"},
		{ClassProcessActivity, "activity_id not in the enum", func(ev map[string]any) { ev["activity_id"] = 6.0; ev["type_uid"] = 100706.0 }, "activity_id: 6"},
		{ClassFileActivity, "file name missing", func(ev map[string]any) { delete(obj(ev, "file"), "name") }, "name: required"},
		{ClassFileActivity, "file type_id not in the enum", func(ev map[string]any) { obj(ev, "file")["type_id"] = 42.0 }, "type_id: 42"},
		{ClassFileActivity, "hash algorithm_id not in the enum", func(ev map[string]any) {
			obj(ev, "file")["hashes"].([]any)[0].(map[string]any)["algorithm_id"] = 42.0
		}, "algorithm_id: 42"},
		{ClassFileActivity, "actor missing", func(ev map[string]any) { delete(ev, "actor") }, "actor: required"},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			orig, ok := byClass[tc.class]
			if !ok {
				t.Fatalf("no event of class %d", tc.class)
			}
			if errs := s.validateEvent(orig, classNamesByUID); len(errs) > 0 {
				t.Fatalf("the unchanged event is invalid: %v", errs)
			}
			ev := deepCopy(t, orig)
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

func deepCopy(t *testing.T, ev map[string]any) map[string]any {
	t.Helper()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestNoSecretValues: the events carry what the chain records carry and nothing else:
// a vault change names its credentials and bindings, never a value; the export of a
// record holds no string the record does not.
func TestNoSecretValues(t *testing.T) {
	r := audit.Record{Seq: 1, Hash: strings.Repeat("b", 64), Prev: strings.Repeat("0", 64), Source: audit.SourceCredential,
		SandboxID: "sb1", Action: "allow", Rule: "vault.patch", Reason: "credential vault patch applied: revision 3",
		Extra: map[string]any{"credentials": []string{"gh"}, "bindings": []string{"github"}}}
	out := string(Mapper{Host: "h"}.Append(nil, &r))
	for _, s := range []string{"ghp_", "Bearer", "Authorization", "value"} {
		if strings.Contains(out, s) {
			t.Errorf("event holds %q: %s", s, out)
		}
	}
}
