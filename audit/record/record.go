// Package record is the audit log's record: one decision, its fixed JSON fields and
// its canonical bytes (what the hash chain of package audit covers). It depends on the
// standard library only, so that clients reading records (the Go SDK, the console) do
// not pull in the writer's dependencies; package audit re-exports its names.
package record

import "time"

// TimeFormat is how "time" is written: RFC 3339, UTC, microseconds.
const TimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// Source names the component that made a decision.
type Source string

// Sources.
const (
	SourceDNS     Source = "dns"
	SourceBPF     Source = "bpf"
	SourceL7      Source = "l7"
	SourceGateway Source = "gateway"
	SourcePolicy  Source = "policy"
	// SourceIngress is a refused credential at a sandbox's ingress (the gateway or
	// lifecycle's server proxy): 401 or 403. The record never carries the credential.
	SourceIngress Source = "ingress"
	// SourceCredential is a Credential Vault decision of egressd's L7 proxy on one
	// request: allow (a binding's credential injected; rule = the binding) or deny (no
	// binding matched: forwarded without a credential, or refused). Never the value.
	SourceCredential Source = "credential"
	// SourceExecd is an agent action through a sandbox's execd (a command, code, a
	// session or PTY opened or closed, a file written, moved, deleted or given new
	// permissions), recorded on the host where the request passed (the gateway or
	// lifecycle's server proxy), never inside the sandbox: extra.op names the action
	// (audit/README.md, "Agent actions").
	SourceExecd Source = "execd"
	// SourceControl is a control-plane call: a mutating lifecycle API or console call
	// (sandbox create, delete, renew, pause, resume, policy and vault changes, key
	// management, signed-URL minting and revocation, snapshots) or a refused one (401,
	// 403, and a user key's 404 on another principal's sandbox), recorded by
	// lifecycle's API handler with the principal, the request id, the target and the
	// outcome: extra.op names the call (audit/README.md, "Control-plane records").
	// Never a key or a vault value.
	SourceControl Source = "control"
)

// Actions besides a policy verdict (allow, deny).
const (
	// ActionLoss: records the writer could not append, extra.lost = how many.
	ActionLoss = "loss"
	// ActionSuppressed: flow records a sandbox's audit rate limit held back,
	// extra.suppressed = how many (egressd; audit/README.md, "Flow records").
	ActionSuppressed = "suppressed"
)

// Record is one decision. Field names are fixed: audit consumers rely on them. Empty
// fields are omitted from the JSON form except the chain fields.
type Record struct {
	// Time is when the decision was made, written as RFC 3339 with microseconds (UTC).
	Time time.Time `json:"time"`
	// Seq is the record's position in the log, assigned by the writer (1-based).
	Seq       uint64 `json:"seq"`
	SandboxID string `json:"sandbox_id,omitempty"`
	Source    Source `json:"source"`
	// Proto is "udp", "tcp", "icmp", "http", "https", ...
	Proto string `json:"proto,omitempty"`
	// Src is the client address (ip or ip:port).
	Src     string `json:"src,omitempty"`
	DstHost string `json:"dst_host,omitempty"`
	DstIP   string `json:"dst_ip,omitempty"`
	DstPort int    `json:"dst_port,omitempty"`
	// QType is the DNS query type (A, AAAA, TXT, ...).
	QType string `json:"qtype,omitempty"`
	// Action is the verdict: allow or deny (loss records: loss).
	Action string `json:"action"`
	// Mode is the policy mode in force: enforce or report.
	Mode string `json:"mode,omitempty"`
	// WouldDeny is set in report mode when enforce would have denied.
	WouldDeny     bool   `json:"would_deny,omitempty"`
	Rule          string `json:"rule,omitempty"`
	Reason        string `json:"reason,omitempty"`
	PolicyVersion uint64 `json:"policy_version,omitempty"`
	// Extra carries source-specific facts with bounded, documented keys (for the
	// gateway: route, status, bytes, duration_ms; for loss records: lost).
	Extra map[string]any `json:"extra,omitempty"`
	// Prev is the hash of the previous record (hex SHA-256), Hash this record's:
	// SHA-256 over Prev and the record's canonical bytes. The writer writes them into
	// the record's log line; they are set on records read back (audit.Scan, audit.Query).
	Prev string `json:"prev"`
	Hash string `json:"hash"`
}
