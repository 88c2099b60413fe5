// Package watch is the data plane's feed from the lifecycle server
// (docs/architecture.md#data-flow): a long-lived HTTP stream of every sandbox's routing
// and enforcement facts, a full snapshot first and then deltas, each stamped with a
// resource version so that a client that reconnects resumes where it stopped without
// missing a change.
//
// Wire format (GET <watch URL>?resourceVersion=<rv>&epoch=<epoch>, response
// application/x-ndjson, one Event per line):
//
//	{"type":"RESET","resourceVersion":41,"epoch":"k3f9"}       full snapshot follows
//	{"type":"ADDED","resourceVersion":41,"sandbox":{...}}       one per sandbox
//	{"type":"SYNCED","resourceVersion":41,"epoch":"k3f9"}      snapshot (or replay) done
//	{"type":"MODIFIED","resourceVersion":42,"sandbox":{...}}   then deltas
//	{"type":"DELETED","resourceVersion":43,"sandbox":{"id":"..."}}
//	{"type":"BOOKMARK","resourceVersion":43,"time":"..."}      heartbeat, every 10 s
//
// A client that sends the epoch and resource version of its last event gets only the
// events after it (then SYNCED) when the server still holds them; otherwise (first
// connection, server restarted with a new epoch, history compacted) it gets a RESET and a
// full snapshot. The Hub serves this; the Client consumes it.
package watch

import (
	"encoding/json"
	"net/netip"
	"strings"
	"time"
)

// EventType names what an Event carries.
type EventType string

// Event types, see the package documentation for their order.
const (
	Reset    EventType = "RESET"
	Added    EventType = "ADDED"
	Modified EventType = "MODIFIED"
	Deleted  EventType = "DELETED"
	Synced   EventType = "SYNCED"
	Bookmark EventType = "BOOKMARK"
)

// Event is one line of the watch stream.
type Event struct {
	Type            EventType `json:"type"`
	ResourceVersion uint64    `json:"resourceVersion"`
	// Epoch identifies the server's history; set on RESET and SYNCED.
	Epoch string `json:"epoch,omitempty"`
	// Time is when the server recorded the change (or sent the bookmark); consumers use it
	// for their watch-lag metric.
	Time time.Time `json:"time,omitzero"`
	// Sandbox is set on ADDED and MODIFIED (whole object) and DELETED (at least the id).
	Sandbox *Sandbox `json:"sandbox,omitempty"`
}

// Sandbox is what the data plane knows of one sandbox. It is a value: the Hub and the
// Client hand out copies, never shared pointers.
type Sandbox struct {
	ID string `json:"id"`
	// State is the OpenSandbox lifecycle state (an opensandbox.State): Pending, Running,
	// Pausing, Paused, Resuming, Stopping, Terminated or Failed.
	State string `json:"state"`
	// Address is the sandbox's IPv4 address on the Airlock network; invalid (zero) until
	// the runtime has started it. Address6 is its IPv6 address when the network has one.
	Address  netip.Addr `json:"address,omitzero"`
	Address6 netip.Addr `json:"address6,omitzero"`
	// Node names the host that runs the sandbox; empty on a single host.
	Node string `json:"node,omitempty"`
	// Runtime locates the sandbox on its node, for egressd to find its veth.
	Runtime Runtime `json:"runtime,omitzero"`
	// Access says who may reach the sandbox's ports through the gateway.
	Access Access `json:"access,omitzero"`
	// Policy is the sandbox's egress policy document as lifecycle stores it (Airlock
	// policy or OpenSandbox networkPolicy JSON, see package policies); empty means the
	// operator's default policy applies. PolicyVersion increases with every change.
	Policy        json.RawMessage `json:"policy,omitempty"`
	PolicyVersion uint64          `json:"policyVersion,omitempty"`
	// ExpiresAt is when the reaper deletes the sandbox; nil for manual cleanup.
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
	// RenewOnAccess, when positive, asks the gateway to send a renew intent extending the
	// expiry by this many seconds when the sandbox is accessed (extension key
	// "access.renew.extend.seconds").
	RenewOnAccess int `json:"renewOnAccess,omitempty"`
	// CredentialProxy is the create request's credentialProxy.enabled: egressd intercepts
	// the sandbox's HTTP(S) for its Credential Vault bindings.
	CredentialProxy bool `json:"credentialProxy,omitempty"`
	// Pool, when set, marks a warm pool member not yet claimed: egressd enforces its
	// (deny-all) policy, the gateway gives it no route. A claim publishes the sandbox
	// again without it.
	Pool string `json:"pool,omitempty"`
	// Owner is the id of the principal whose key created the sandbox (package
	// principal); empty for sandboxes made before principals. The gateway admits a
	// `user` key only on sandboxes it owns.
	Owner string `json:"owner,omitempty"`
	// TraceParent is the W3C traceparent (Trace Context, §3.2) of the create that made
	// the sandbox when lifecycle exports traces: egressd's attach span joins that trace.
	// Empty otherwise.
	TraceParent string `json:"traceParent,omitempty"`
}

// Runtime locates a sandbox on its node.
type Runtime struct {
	// Kind is "docker" or "kubernetes".
	Kind string `json:"kind,omitempty"`
	// ContainerID is the Docker container id or the pod's name.
	ContainerID string `json:"containerID,omitempty"`
	// Pid is the sandbox's init process as seen from the node (0 when stopped); its
	// network namespace is /proc/<Pid>/ns/net.
	Pid int `json:"pid,omitempty"`
	// HostInterface is the host-side veth name when the runtime knows it.
	HostInterface string `json:"hostInterface,omitempty"`
	// PodUID is the pod's UID (Kubernetes): egressd finds the pod's cgroup by it.
	PodUID string `json:"podUID,omitempty"`
	// HostIP is the address of the pod's node (Kubernetes; empty elsewhere): the
	// gateway asks that node's egressd for the process groups of execd commands
	// (execdaudit.GroupsPath).
	HostIP string `json:"hostIP,omitempty"`
}

// AccessMode is how the gateway admits requests to a sandbox port.
type AccessMode string

// Access modes.
const (
	// Public admits every request.
	Public AccessMode = "public"
	// Token admits requests that carry the sandbox's access token (header
	// X-Airlock-Access-Token or OpenSandbox-Secure-Access) or a valid signed URL.
	Token AccessMode = "token"
	// Signed admits only requests through a valid, unexpired signed URL.
	Signed AccessMode = "signed"
)

// Access is the per-sandbox, per-port admission rule.
type Access struct {
	// Mode applies to every port not listed in Ports; empty means Public.
	Mode AccessMode `json:"mode,omitempty"`
	// Ports overrides Mode for single ports.
	Ports map[int]AccessMode `json:"ports,omitempty"`
	// TokenSHA256 is the hex SHA-256 of the sandbox's access token; the token itself
	// never leaves lifecycle.
	TokenSHA256 string `json:"tokenSHA256,omitempty"`
	// SignedEpoch is the sandbox's signed-URL epoch: a signed URL verifies only under the
	// epoch it was minted with (signedurl.Keyring.VerifyEpoch), so lifecycle revokes every
	// signed URL of the sandbox by incrementing it. 0 (absent) for a sandbox whose URLs
	// were never revoked.
	SignedEpoch uint64 `json:"signedEpoch,omitempty"`
}

// ModeFor returns the admission mode of port.
func (a Access) ModeFor(port int) AccessMode {
	if m, ok := a.Ports[port]; ok {
		return m
	}
	if a.Mode == "" {
		return Public
	}
	return a.Mode
}

// EnforcedPath is egressd's status route on its metrics listener: GET
// EnforcedPath+"<sandbox id>" answers 200 with Enforced when this node's datapath
// enforces the sandbox, 404 otherwise. Lifecycle replicas on Kubernetes ask the node of
// a new sandbox's pod before they release its entrypoint (and after a policy change
// before they answer), as airlock up asks its in-process egressd.
const EnforcedPath = "/v1/enforced/"

// VaultPath is the Credential Vault's node API of egressd on Kubernetes, on the same
// listener as EnforcedPath and behind the API key (opensandbox.HeaderAPIKey): the
// vault of a credentialProxy sandbox lives on its node, so lifecycle hands the node's
// egressd the sandbox's interception CA (PUT VaultPath+"<id>/ca", body VaultCA, 204)
// before it releases the entrypoint, forwards the egress API's /credential-vault
// routes (VaultPath+"<id>/credential-vault…", answered as egress-api.yaml says) and
// removes the vault with the sandbox (DELETE VaultPath+"<id>", 204). Snapshots re-bind
// a vault through POST VaultPath+"copy" (body VaultCopy, 204): the node's egressd
// copies the sealed credentials and bindings from one holder to another, so values
// never leave it.
const VaultPath = "/v1/vault/"

// VaultCopy is the body of POST VaultPath+"copy": give holder To a copy of holder
// From's credentials and bindings (sealed, values included; To keeps its own CA). One
// of the two is a sandbox the node runs and the other a snapshot (IsSnapshotID): at
// capture From is the source sandbox and To the snapshot, whose copy the node keeps
// (it outlives the source) until the snapshot's image is removed or DELETE
// VaultPath+"<snapshot id>"; at restore From is the snapshot and To the new sandbox.
type VaultCopy struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// IsSnapshotID reports whether id has the form of a lifecycle snapshot id: "snap-"
// followed by 1 to 64 characters [a-z0-9] (lifecycle's ids are "snap-" and a sandbox
// id, which never holds a '-').
func IsSnapshotID(id string) bool {
	rest, ok := strings.CutPrefix(id, "snap-")
	if !ok || rest == "" || len(rest) > 64 {
		return false
	}
	for _, c := range rest {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// VaultCA is the body of PUT VaultPath+"<id>/ca": a sandbox's interception CA, the
// certificate in DER and its key in PKCS #8 DER (base64 in JSON).
type VaultCA struct {
	Cert []byte `json:"cert"`
	Key  []byte `json:"key"`
}

// Enforced is the body of a 200 from EnforcedPath.
type Enforced struct {
	SandboxID string `json:"sandboxId"`
	// PolicyVersion is the policy version the datapath enforces.
	PolicyVersion uint64 `json:"policyVersion"`
}

// SnapshotPath is the snapshot node API of egressd on Kubernetes (`airlock egressd
// --containerd-socket`), on the same listener as EnforcedPath and behind the API key:
// POST SnapshotPath+"<sandbox id>" (body SnapshotCommit) commits the sandbox pod's
// container into a node-local image in the node's containerd and answers 200 with
// SnapshotCommitted (404 when this node does not run the sandbox or the container is
// not its pod's); POST SnapshotPath+"remove" (body SnapshotRemove) deletes such an
// image (204, also when it is gone already).
const SnapshotPath = "/v1/snapshot/"

// SnapshotCommit is the body of a commit: the pod's namespace and name, the sandbox
// container's name and containerd id (the pod status's containerID without its
// "containerd://"), the image reference to make, the snapshot's id, and environment
// variables to leave out of the image (the runtime's own).
type SnapshotCommit struct {
	Namespace   string   `json:"namespace"`
	Pod         string   `json:"pod"`
	Container   string   `json:"container"`
	ContainerID string   `json:"containerId"`
	Ref         string   `json:"ref"`
	SnapshotID  string   `json:"snapshotId"`
	DropEnv     []string `json:"dropEnv,omitempty"`
}

// SnapshotCommitted is the answer of a commit: the image, its manifest digest and the
// bytes of its new layer (compressed).
type SnapshotCommitted struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
	Bytes  int64  `json:"bytes"`
}

// SnapshotRemove is the body of a remove: the image reference a commit made.
type SnapshotRemove struct {
	Ref string `json:"ref"`
}

// SnapshotRefPrefix starts every snapshot image reference on Kubernetes:
// SnapshotRefPrefix+"<node name>:<snapshot id>". The node's egressd removes only such
// images.
const SnapshotRefPrefix = "airlock.local/snapshot/"
