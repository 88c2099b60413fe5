// Package ocsf maps Airlock's audit records (package audit/record) to OCSF events
// (Open Cybersecurity Schema Framework, https://schema.ocsf.io; schema source vendored
// for the tests in testdata/schema) and exports them as JSON Lines beside the chain
// (Exporter, an audit.Sink).
//
// Classes: Network Activity (4001) for flow records and refusals (source bpf), DNS
// Activity (4003) for dns, HTTP Activity (4002) for gateway requests, ingress
// refusals, L7 decisions and Credential Vault decisions on a request, API Activity
// (6003) for Credential Vault changes and for control-plane calls (source control:
// the principal, the op, the target and the answer; a policy change made through the
// API is one such call, so its policy record gets no API Activity of its own; a
// console sign-in or sign-out is Authentication, 3002), Device
// Config State Change (5019) for policy versions (source policy), Event Log Activity
// (1008) for the writer's own loss and suppressed records, Process Activity (1007)
// for agent actions through execd (commands, code, sessions, PTYs) and File System
// Activity (1001) for its file operations (source execd), and Base Event (0) for a
// source this package does not know. Each record is one event, whose metadata points
// back to its chain record: original_event_uid and uid are the record's seq,
// correlation_uid the record's chain hash; message is the record's reason; unmapped
// keeps Airlock's own fields (the sandbox, action, rule, mode, policy version, prev
// hash and the extra keys the event does not map). Records never carry secret values,
// so neither do the events.
package ocsf

import (
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/airlockdev/airlock/audit/record"
)

// SchemaVersion is the OCSF version the events follow (metadata.version): the
// version of the schema source they are validated against (testdata/schema).
const SchemaVersion = "1.9.0-dev"

// Class uids of the events this package writes.
const (
	ClassBase              = 0
	ClassEventLog          = 1008
	ClassNetworkActivity   = 4001
	ClassHTTPActivity      = 4002
	ClassDNSActivity       = 4003
	ClassDeviceConfigState = 5019
	ClassAPIActivity       = 6003
	ClassAuthentication    = 3002
)

// metadataHead opens metadata with what every event has.
const metadataHead = `{"version":"` + SchemaVersion + `","product":{"name":"Airlock","vendor_name":"Airlock"},` +
	`"log_name":"audit","log_provider":"airlock"`

// Severity and status ids (base event).
const (
	sevInfo, sevLow, sevHigh  = 1, 2, 4
	statusSuccess, statusFail = 1, 2
)

// Security control profile ids.
const (
	actionAllowed, actionDenied                              = 1, 2
	dispAllowed, dispBlocked, dispDetected, dispUnauthorized = 1, 2, 15, 26
)

// Captions of the severity and disposition ids the events use.
var (
	severityNames    = map[int]string{sevInfo: "Informational", sevLow: "Low", sevHigh: "High"}
	dispositionNames = map[int]string{dispBlocked: "Blocked", dispUnauthorized: "Unauthorized"}
)

var classNames = map[int]string{
	ClassBase: "Base Event", ClassEventLog: "Event Log Activity", ClassNetworkActivity: "Network Activity",
	ClassHTTPActivity: "HTTP Activity", ClassDNSActivity: "DNS Activity", ClassDeviceConfigState: "Device Config State Change",
	ClassAPIActivity: "API Activity", ClassAuthentication: "Authentication", ClassFileActivity: "File System Activity", ClassProcessActivity: "Process Activity",
}

// httpActivity is HTTP Activity's activity_id for a request method (http_request.http_method).
var httpActivity = map[string]int{"CONNECT": 1, "DELETE": 2, "GET": 3, "HEAD": 4, "OPTIONS": 5, "POST": 6, "PUT": 7,
	"TRACE": 8, "PATCH": 9}

// rcodes are DNS Activity's rcode_id by the record's extra.rcode (miekg/dns names).
var rcodes = map[string]int{"NOERROR": 0, "FORMERR": 1, "SERVFAIL": 2, "NXDOMAIN": 3, "NOTIMP": 4, "REFUSED": 5,
	"YXDOMAIN": 6, "YXRRSET": 7, "NXRRSET": 8, "NOTAUTH": 9, "NOTZONE": 10}

// rcodeCaptions are the schema's captions of rcode_id.
var rcodeCaptions = map[int]string{0: "NoError", 1: "FormError", 2: "ServError", 3: "NXDomain", 4: "NotImp", 5: "Refused",
	6: "YXDomain", 7: "YXRRSet", 8: "NXRRSet", 9: "NotAuth", 10: "NotZone"}

// Mapper turns records into OCSF events. Host names the machine that runs the writer
// (device.hostname of events about Airlock itself, not a sandbox).
type Mapper struct {
	Host string
}

// Append appends the OCSF event of r to b, one JSON object ending in "\n". r must
// have been written (Seq and Hash set).
func (m Mapper) Append(b []byte, r *record.Record) []byte {
	w := jw{b: b}
	switch {
	case r.Action == record.ActionLoss || r.Action == record.ActionSuppressed:
		m.eventLog(&w, r)
	case r.Source == record.SourceBPF:
		m.network(&w, r)
	case r.Source == record.SourceDNS:
		m.dns(&w, r)
	case r.Source == record.SourceCredential && strings.HasPrefix(r.Rule, "vault."):
		m.vault(&w, r)
	case r.Source == record.SourceGateway || r.Source == record.SourceIngress || r.Source == record.SourceL7 ||
		r.Source == record.SourceCredential:
		m.http(&w, r)
	case r.Source == record.SourceExecd:
		m.execd(&w, r)
	case r.Source == record.SourceControl:
		m.control(&w, r)
	case r.Source == record.SourcePolicy:
		m.policy(&w, r)
	default:
		m.base(&w, r)
	}
	return append(w.b, '\n')
}

// header opens an event and writes the classification, time, metadata and status.
func header(w *jw, r *record.Record, class, activity int, activityName string, profiles []string) {
	w.comma = false
	w.open("")
	w.int("class_uid", int64(class))
	w.str("class_name", classNames[class])
	w.int("category_uid", int64(class/1000))
	w.int("activity_id", int64(activity))
	w.str("activity_name", activityName)
	w.int("type_uid", int64(class*100+activity))
	sev := sevInfo
	if r.Action == "deny" {
		sev = sevLow
	}
	if r.Action == record.ActionLoss {
		sev = sevHigh
	}
	w.int("severity_id", int64(sev))
	w.str("severity", severityNames[sev])
	if r.Action == "deny" || r.Action == record.ActionLoss || (r.Source == record.SourceExecd || r.Source == record.SourceControl) && extraString(r, "outcome") == "failure" {
		w.int("status_id", statusFail)
		w.str("status", "Failure")
	} else {
		w.int("status_id", statusSuccess)
		w.str("status", "Success")
	}
	w.str("message", r.Reason)
	w.int("time", r.Time.UnixMilli())
	w.key("metadata")
	w.b = append(w.b, metadataHead...)
	w.str("event_code", string(r.Source))
	w.key("original_event_uid")
	w.b = strconv.AppendUint(append(w.b, '"'), r.Seq, 10)
	w.b = append(w.b, '"')
	w.key("uid")
	w.b = strconv.AppendUint(append(w.b, '"'), r.Seq, 10)
	w.b = append(w.b, '"')
	w.str("correlation_uid", r.Hash)
	if len(profiles) > 0 {
		w.array("profiles")
		for _, p := range profiles {
			w.elem(p)
		}
		w.end()
	}
	w.close()
}

// footer writes unmapped (Airlock's own fields but the reason, which is the message,
// and the extra keys the event maps, named in mapped) and closes the event.
func footer(w *jw, r *record.Record, mapped ...string) {
	w.open("unmapped")
	w.str("source", string(r.Source))
	w.str("sandbox_id", r.SandboxID)
	w.str("action", r.Action)
	w.str("mode", r.Mode)
	if r.WouldDeny {
		w.bool("would_deny", true)
	}
	w.str("rule", r.Rule)
	if r.PolicyVersion > 0 {
		w.int("policy_version", int64(r.PolicyVersion))
	}
	w.str("prev", r.Prev)
	var arr [8]string
	keys := arr[:0]
	for k := range r.Extra {
		if !slices.Contains(mapped, k) {
			keys = append(keys, k)
		}
	}
	if len(keys) > 0 {
		slices.Sort(keys)
		w.open("extra")
		for _, k := range keys {
			w.value(k, r.Extra[k])
		}
		w.close()
	}
	w.close()
	w.close()
}

// control writes the security control profile's verdict: action, disposition, rule
// and, for an egress decision, the policy version.
func control(w *jw, r *record.Record, denied int) {
	switch {
	case r.Action == "deny":
		w.int("action_id", actionDenied)
		w.str("action", "Denied")
		w.int("disposition_id", int64(denied))
		w.str("disposition", dispositionNames[denied])
	case r.WouldDeny:
		w.int("action_id", actionAllowed)
		w.str("action", "Allowed")
		w.int("disposition_id", dispDetected)
		w.str("disposition", "Detected")
	default:
		w.int("action_id", actionAllowed)
		w.str("action", "Allowed")
		w.int("disposition_id", dispAllowed)
		w.str("disposition", "Allowed")
	}
	if r.Rule != "" {
		w.open("firewall_rule")
		w.str("name", r.Rule)
		w.close()
	}
	if r.PolicyVersion > 0 { // an egress decision under a policy version
		policy(w, r, "egress")
	}
}

// policy writes the policy object of r's sandbox (name, version) when r names one.
func policy(w *jw, r *record.Record, name string) {
	if r.PolicyVersion == 0 && r.SandboxID == "" {
		return
	}
	if p, ok := r.Extra["policy"].(string); ok && p != "" {
		name = p
	}
	w.open("policy")
	w.str("name", name)
	w.str("uid", r.SandboxID)
	if r.PolicyVersion > 0 {
		w.key("version")
		w.b = strconv.AppendUint(append(w.b, '"'), r.PolicyVersion, 10)
		w.b = append(w.b, '"')
	}
	w.close()
}

// endpoint writes a network endpoint: addr is ip, ip:port or [ip]:port, uid the
// sandbox (may be empty), host a name; port overrides addr's port when not zero.
// Nothing is written when all are empty.
func endpoint(w *jw, k, addr, uid, host string, port int) {
	ip, p := splitAddr(addr)
	if port != 0 {
		p = port
	}
	if ip == "" && uid == "" && host == "" {
		return
	}
	w.open(k)
	w.str("uid", uid)
	w.str("hostname", host)
	w.str("ip", ip)
	if p > 0 && p <= 65535 {
		w.int("port", int64(p))
	}
	w.close()
}

// splitAddr splits "ip", "ip:port" or "[ip]:port"; an address that is not an IP
// gives "".
func splitAddr(s string) (ip string, port int) {
	if s == "" {
		return "", 0
	}
	// "ip:port" has one colon or a bracket; a bare IPv6 address has two or more colons
	// and no bracket. Asking the parser that fits first keeps the export from making
	// a parse error per record.
	if s[0] == '[' || strings.Count(s, ":") == 1 {
		if ap, err := netip.ParseAddrPort(s); err == nil {
			return strings.TrimSuffix(strings.TrimPrefix(s[:strings.LastIndexByte(s, ':')], "["), "]"), int(ap.Port())
		}
		return "", 0
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return s, 0
	}
	return "", 0
}

// hostOnly is a Host header without its port.
func hostOnly(h string) string {
	if hh, _, err := net.SplitHostPort(h); err == nil {
		return hh
	}
	return h
}

func extraInt(r *record.Record, k string) (int64, bool) {
	switch v := r.Extra[k].(type) {
	case int:
		return int64(v), true
	case int64:
		return v, true
	case uint64:
		return int64(v), true
	case uint32:
		return int64(v), true
	case float64:
		return int64(v), true
	}
	return 0, false
}

func extraString(r *record.Record, k string) string {
	s, _ := r.Extra[k].(string)
	return s
}

// strings of extra k: []string or []any of strings (a record read back from JSON).
func extraStrings(r *record.Record, k string) []string {
	switch v := r.Extra[k].(type) {
	case []string:
		return v
	case []any:
		out := make([]string, 0, len(v))
		for _, e := range v {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}
