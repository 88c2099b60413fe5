package ocsf

import (
	"net/netip"
	"path"
	"strings"

	"github.com/airlockdev/airlock/audit/record"
)

// network writes a flow record or a refusal (source bpf) as Network Activity: Refuse
// for a denied flow, Traffic for an allowed one, with the flow's counters.
func (m Mapper) network(w *jw, r *record.Record) {
	activity, name := 6, "Traffic"
	if r.Action == "deny" {
		activity, name = 5, "Refuse"
	}
	proc, attributed := r.Extra["process"].(map[string]any)
	profiles := []string{"security_control"}
	if attributed {
		profiles = append(profiles, "host") // actor is the host profile's
	}
	header(w, r, ClassNetworkActivity, activity, name, profiles)
	if attributed {
		flowActor(w, proc)
	}
	endpoint(w, "src_endpoint", r.Src, r.SandboxID, "", 0)
	endpoint(w, "dst_endpoint", r.DstIP, "", r.DstHost, r.DstPort)
	connection(w, r.Proto)
	p, okp := extraInt(r, "packets")
	b, okb := extraInt(r, "bytes")
	if okp || okb {
		w.open("traffic")
		if okp {
			w.int("packets_out", p)
			w.int("packets", p)
		}
		if okb {
			w.int("bytes_out", b)
			w.int("bytes", b)
		}
		w.close()
	}
	control(w, r, dispBlocked)
	footer(w, r, "packets", "bytes")
}

// flowActor writes the process that opened a flow (extra.process of a flow record,
// egressd's process attribution) as actor.process: host pid, thread, name, command
// line, executable (its path, or only the kernel's name of it when the process had
// ended before /proc was read) and parent pid. The process group and the ids in the sandbox's
// namespace stay in unmapped.extra (the container profile's namespace_pid would need
// the container object).
func flowActor(w *jw, p map[string]any) {
	num := func(k string) (int64, bool) {
		switch v := p[k].(type) {
		case float64:
			return int64(v), true
		case uint32:
			return int64(v), true
		case int:
			return int64(v), true
		case int64:
			return v, true
		}
		return 0, false
	}
	str := func(k string) string { s, _ := p[k].(string); return s }
	w.open("actor")
	w.open("process")
	if pid, ok := num("pid"); ok {
		w.int("pid", pid)
	}
	if tid, ok := num("tid"); ok {
		w.int("tid", tid)
	}
	w.str("name", str("name"))
	w.str("cmd_line", str("cmdline"))
	if exe, name := str("exe"), str("exe_name"); exe != "" || name != "" {
		w.open("file")
		if exe != "" {
			name = path.Base(exe)
		}
		w.str("name", name)
		w.str("path", exe)
		w.int("type_id", 1)
		w.str("type", "Regular File")
		w.close()
	}
	if ppid, ok := num("ppid"); ok {
		w.open("parent_process")
		w.int("pid", ppid)
		w.close()
	}
	w.close()
	w.close()
}

// connection writes connection_info: outbound, with the transport protocol.
func connection(w *jw, proto string) {
	w.open("connection_info")
	w.int("direction_id", 2)
	w.str("direction", "Outbound")
	w.str("protocol_name", proto)
	switch proto {
	case "tcp":
		w.int("protocol_num", 6)
	case "udp":
		w.int("protocol_num", 17)
	}
	w.close()
}

// dns writes a DNS record as DNS Activity: Response when an rcode was answered
// (with the answers), Query otherwise.
func (m Mapper) dns(w *jw, r *record.Record) {
	rc := extraString(r, "rcode")
	activity, name := 1, "Query"
	if rc != "" {
		activity, name = 2, "Response"
	}
	header(w, r, ClassDNSActivity, activity, name, []string{"security_control"})
	endpoint(w, "src_endpoint", r.Src, r.SandboxID, "", 0)
	connection(w, r.Proto)
	if r.DstHost != "" {
		w.open("query")
		w.str("hostname", r.DstHost)
		w.str("type", r.QType)
		w.str("class", "IN")
		w.close()
	}
	if ips := extraStrings(r, "answers"); len(ips) > 0 {
		ttl, hasTTL := extraInt(r, "ttl_s")
		w.array("answers")
		for _, ip := range ips {
			w.open("")
			w.str("rdata", ip)
			if a, err := netip.ParseAddr(ip); err == nil && a.Is6() && !a.Is4In6() {
				w.str("type", "AAAA")
			} else if err == nil {
				w.str("type", "A")
			}
			w.str("class", "IN")
			if hasTTL {
				w.int("ttl", ttl)
			}
			w.close()
		}
		w.end()
	}
	if id, ok := rcodes[rc]; ok {
		w.int("rcode_id", int64(id))
		w.str("rcode", rcodeCaptions[id])
	} else if rc != "" {
		w.int("rcode_id", 99)
		w.str("rcode", rc)
	}
	control(w, r, dispBlocked)
	footer(w, r, "answers", "rcode", "ttl_s")
}

// http writes a gateway request, an ingress refusal, an L7 decision or a Credential
// Vault decision as HTTP Activity: the activity is the request's method (Connect for
// an L7 decision on a TLS name or a CONNECT).
func (m Mapper) http(w *jw, r *record.Record) {
	method := strings.ToUpper(extraString(r, "method"))
	activity, ok := httpActivity[method]
	name := activityCaption(method)
	switch {
	case method == "":
		activity, name = 1, "Connect"
	case !ok:
		activity, name = 99, "Other"
	}
	header(w, r, ClassHTTPActivity, activity, name, []string{"security_control"})
	inbound := r.Source == record.SourceGateway || r.Source == record.SourceIngress
	host := hostOnly(r.DstHost)
	if inbound {
		// the client comes from outside; the sandbox serves
		endpoint(w, "src_endpoint", r.Src, "", "", 0)
		endpoint(w, "dst_endpoint", r.DstIP, r.SandboxID, host, r.DstPort)
	} else {
		endpoint(w, "src_endpoint", r.Src, r.SandboxID, "", 0)
		endpoint(w, "dst_endpoint", r.DstIP, "", host, r.DstPort)
	}
	w.open("connection_info")
	if inbound {
		w.int("direction_id", 1)
		w.str("direction", "Inbound")
	} else {
		w.int("direction_id", 2)
		w.str("direction", "Outbound")
	}
	w.str("protocol_name", "tcp")
	w.int("protocol_num", 6)
	w.close()
	w.open("http_request")
	if ok {
		w.str("http_method", method)
	}
	w.str("uid", extraString(r, "request_id"))
	w.open("url")
	scheme := r.Proto
	if scheme != "http" && scheme != "https" {
		scheme = "http"
	}
	path := extraString(r, "path")
	w.str("scheme", scheme)
	w.str("hostname", host)
	if !inbound && r.DstPort > 0 && r.DstPort <= 65535 {
		w.int("port", int64(r.DstPort)) // inbound: the sandbox's port, not the URL's
	}
	w.str("path", path)
	if r.DstHost != "" {
		w.key("url_string")
		w.b = append(append(append(w.b, '"'), scheme...), "://"...)
		w.b = append(record.AppendEscaped(record.AppendEscaped(w.b, r.DstHost), path), '"')
	} else if path == "" {
		w.str("path", "/")
	}
	w.close()
	w.close()
	if code, ok := extraInt(r, "status"); ok && code > 0 {
		w.open("http_response")
		w.int("code", code)
		w.close()
		w.int("http_status", code)
	}
	denied := dispBlocked
	if r.Source == record.SourceIngress {
		denied = dispUnauthorized
	}
	control(w, r, denied)
	footer(w, r, "method", "path", "status", "request_id")
}

// httpActivityCaptions are the captions of httpActivity's methods, made once.
var httpActivityCaptions = func() map[string]string {
	c := make(map[string]string, len(httpActivity))
	for m := range httpActivity {
		c[m] = m[:1] + strings.ToLower(m[1:])
	}
	return c
}()

// activityCaption is the schema's caption of a method's HTTP activity ("Get").
func activityCaption(method string) string {
	if c, ok := httpActivityCaptions[method]; ok {
		return c
	}
	if method == "" {
		return ""
	}
	return method[:1] + strings.ToLower(method[1:])
}

// vault writes an applied Credential Vault change as API Activity.
func (m Mapper) vault(w *jw, r *record.Record) {
	op := strings.TrimPrefix(r.Rule, "vault.")
	activity, name := 3, "Update"
	switch op {
	case "create":
		activity, name = 1, "Create"
	case "delete":
		activity, name = 4, "Delete"
	}
	header(w, r, ClassAPIActivity, activity, name, nil)
	api(w, r, r.Rule, "credential vault")
	footer(w, r)
}

// api writes API Activity's actor, api, source endpoint and resources. The principal
// behind a call is not recorded yet: the actor is Airlock's control plane.
func api(w *jw, r *record.Record, operation, service string) {
	w.open("actor")
	w.str("app_name", "airlock")
	w.close()
	w.open("api")
	w.str("operation", operation)
	w.open("service")
	w.str("name", service)
	w.close()
	w.close()
	if ip, _ := splitAddr(r.Src); ip != "" {
		endpoint(w, "src_endpoint", r.Src, "", "", 0)
	} else {
		w.open("src_endpoint")
		w.str("name", "unknown")
		w.close()
	}
	if r.SandboxID != "" {
		w.array("resources")
		w.open("")
		w.str("uid", r.SandboxID)
		w.str("type", "sandbox")
		w.close()
		w.end()
	}
}

// policy writes a policy record as Device Config State Change: the sandbox (or, for
// the policy library, this host) and the policy version now in force.
func (m Mapper) policy(w *jw, r *record.Record) {
	header(w, r, ClassDeviceConfigState, 1, "Log", []string{"security_control"})
	m.device(w, r.SandboxID)
	policy(w, r, "egress")
	footer(w, r)
}

// device writes the device an event is about: the sandbox, or this host.
func (m Mapper) device(w *jw, sandbox string) {
	w.open("device")
	if sandbox != "" {
		w.str("uid", sandbox)
		w.str("name", sandbox)
		w.int("type_id", 6)
		w.str("type", "Virtual")
	} else {
		host := m.Host
		if host == "" {
			host = "localhost"
		}
		w.str("hostname", host)
		w.str("name", host)
		w.int("type_id", 1)
		w.str("type", "Server")
	}
	w.close()
}

// eventLog writes the writer's own loss and suppressed records as Event Log Activity
// (Other: Loss or Suppressed) with count = how many records.
func (m Mapper) eventLog(w *jw, r *record.Record) {
	name := "Suppressed"
	if r.Action == record.ActionLoss {
		name = "Loss"
	}
	header(w, r, ClassEventLog, 99, name, []string{"host"})
	n, ok := extraInt(r, "lost")
	if !ok {
		n, _ = extraInt(r, "suppressed")
	}
	w.int("count", n)
	w.str("log_name", "audit")
	w.str("log_provider", "airlock")
	m.device(w, "")
	footer(w, r)
}

// base writes a record of a source this package does not know as a Base Event.
func (m Mapper) base(w *jw, r *record.Record) {
	header(w, r, ClassBase, 99, "Other", nil)
	footer(w, r)
}
