package ocsf

import (
	"cmp"
	"strings"

	"github.com/airlockdev/airlock/audit/record"
)

// controlActivity is API Activity's activity_id (Create 1, Read 2, Update 3, Delete 4)
// of a control-plane call by the last word of its op (extra.op, "sandbox.create").
// Others are Update, and a refused read (op api.read) is Read.
var controlActivity = map[string]int{
	"create": 1, "mint": 1, "read": 2, "delete": 4, "revoke": 4,
}

var apiActivityNames = map[int]string{1: "Create", 2: "Read", 3: "Update", 4: "Delete"}

// control writes a control-plane call (source control) as API Activity: the principal
// as actor.user (uid, name; type Admin for the admin role, else User), the op as
// api.operation of the lifecycle API service, the client as src_endpoint, the sandbox
// and the target (a key, snapshot or library policy) as resources, and the request
// (method, path, request id) and the answer's status as http_request and
// http_response. A refusal (action deny) has status Failure, as has a call the API
// answered with an error (extra.outcome failure).
func (m Mapper) control(w *jw, r *record.Record) {
	op := extraString(r, "op")
	if op == "console.sign_in" || op == "console.sign_out" {
		m.authentication(w, r, op == "console.sign_out")
		return
	}
	verb := op[strings.LastIndexByte(op, '.')+1:]
	activity, ok := controlActivity[verb]
	if !ok {
		activity = 3
	}
	header(w, r, ClassAPIActivity, activity, apiActivityNames[activity], nil)
	w.open("actor")
	if id := extraString(r, "principal"); id != "" {
		w.open("user")
		w.str("uid", id)
		w.str("name", extraString(r, "principal_name"))
		if extraString(r, "role") == "admin" {
			w.int("type_id", 2)
			w.str("type", "Admin")
		} else {
			w.int("type_id", 1)
			w.str("type", "User")
		}
		w.close()
	} else {
		w.str("app_name", "unauthenticated client")
	}
	w.close()
	w.open("api")
	w.str("operation", op)
	w.open("service")
	w.str("name", "lifecycle API")
	w.close()
	w.close()
	if ip, _ := splitAddr(r.Src); ip != "" {
		endpoint(w, "src_endpoint", r.Src, "", "", 0)
	} else {
		w.open("src_endpoint")
		w.str("name", "unknown")
		w.close()
	}
	target, typ := extraString(r, "target"), extraString(r, "target_type")
	if r.SandboxID != "" || target != "" {
		w.array("resources")
		if r.SandboxID != "" {
			w.open("")
			w.str("uid", r.SandboxID)
			w.str("type", "sandbox")
			w.close()
		}
		if target != "" {
			w.open("")
			w.str("uid", target)
			w.str("type", typ)
			w.close()
		}
		w.end()
	}
	controlHTTP(w, r)
	footer(w, r, "op", "method", "path", "request_id", "status", "principal", "principal_name", "target", "target_type")
}

// controlHTTP writes a control record's request (method, request id, path) and answer
// (status) as http_request and http_response.
func controlHTTP(w *jw, r *record.Record) {
	w.open("http_request")
	if method := extraString(r, "method"); method != "" {
		if _, known := httpActivity[method]; known {
			w.str("http_method", method)
		}
	}
	w.str("uid", extraString(r, "request_id"))
	w.open("url")
	w.str("path", cmp.Or(extraString(r, "path"), "/"))
	w.close()
	w.close()
	if code, ok := extraInt(r, "status"); ok && code > 0 {
		w.open("http_response")
		w.int("code", code)
		w.close()
	}
}

// authentication writes a console sign-in (op console.sign_in) or sign-out
// (console.sign_out) as Authentication (3002): Logon or Logoff, the principal as user
// (name "unknown" for a failed sign-in, which has none), the console as service, an
// API key as the protocol (Other), the client as src_endpoint; a failed or refused
// sign-in has status Failure and its reason as status_detail.
func (m Mapper) authentication(w *jw, r *record.Record, logoff bool) {
	activity, name := 1, "Logon"
	if logoff {
		activity, name = 2, "Logoff"
	}
	header(w, r, ClassAuthentication, activity, name, nil)
	w.open("user")
	if id := extraString(r, "principal"); id != "" {
		w.str("uid", id)
		w.str("name", extraString(r, "principal_name"))
	} else {
		w.str("name", "unknown")
	}
	w.close()
	w.int("auth_protocol_id", 99)
	w.str("auth_protocol", "API key")
	w.bool("is_remote", true)
	w.open("service")
	w.str("name", "Airlock console")
	w.close()
	if ip, _ := splitAddr(r.Src); ip != "" {
		endpoint(w, "src_endpoint", r.Src, "", "", 0)
	}
	if r.Action == "deny" {
		w.str("status_detail", r.Reason)
	}
	controlHTTP(w, r)
	footer(w, r, "op", "method", "path", "request_id", "status", "principal", "principal_name")
}
