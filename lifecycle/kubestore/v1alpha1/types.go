// Package v1alpha1 is the airlock.dev/v1alpha1 API: the resources in which lifecycle
// keeps its state on Kubernetes (lifecycle/kubestore). The CRDs in
// deploy/kubernetes/base/crds are generated from these types (make generate,
// controller-gen); kubestore converts a lifecycle record to and from these shapes by
// their JSON names, so a field added to the record must be added here too (a test
// round-trips every record field through a real API server).
//
// +kubebuilder:object:generate=false
// +groupName=airlock.dev
package v1alpha1

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Group, Version and the resources' plural names.
const (
	Group             = "airlock.dev"
	Version           = "v1alpha1"
	SandboxResource   = "sandboxes"
	PolicyResource    = "policies"
	SandboxKind       = "Sandbox"
	PolicyKind        = "Policy"
	SandboxListKind   = "SandboxList"
	PolicyListKind    = "PolicyList"
	APIVersion        = Group + "/" + Version
	LabelInstance     = "airlock.dev/instance"
	LabelSandboxID    = "airlock.dev/sandbox-id"
	LabelAccessToken  = "airlock.dev/access-token"
	AccessTokenKey    = "token"
	AccessTokenPrefix = "airlock-access-"
)

// Sandbox is one sandbox of the lifecycle API: what it was created with (spec) and
// what lifecycle observed (status; not a subresource: lifecycle is the only writer of
// both, in one write). Its name is the sandbox id. The sandbox's access
// token is not here: it lives in the Secret airlock-access-<id>.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=asbx,categories=airlock
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.sandboxStatus.state`
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.image`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.node`
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.status.address`
// +kubebuilder:printcolumn:name="Expires",type=string,JSONPath=`.spec.expiresAt`
type Sandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SandboxSpec   `json:"spec"`
	Status SandboxStatus `json:"status,omitempty"`
}

// SandboxSpec is what the sandbox was created with and what its users change (expiry,
// policy). Field meanings are those of the lifecycle API (sandbox-lifecycle.yml).
type SandboxSpec struct {
	// Image is the image reference the client asked for.
	Image    string    `json:"image"`
	Platform *Platform `json:"platform,omitempty"`
	// Entrypoint is the user's entrypoint (execd wraps it).
	Entrypoint     []string          `json:"entrypoint,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	ResourceLimits map[string]string `json:"resourceLimits,omitempty"`
	Extensions     map[string]string `json:"extensions,omitempty"`
	// CreatedAt and ExpiresAt are RFC 3339 times; no ExpiresAt: manual cleanup.
	// +kubebuilder:validation:Format=date-time
	CreatedAt string `json:"createdAt"`
	// +kubebuilder:validation:Format=date-time
	ExpiresAt *string `json:"expiresAt,omitempty"`
	// SecureAccess makes every port need the access token.
	SecureAccess *bool `json:"secureAccess,omitempty"`
	// Policy is the sandbox's own egress policy document (with PolicyName: only its
	// additions); PolicyVersion counts its changes.
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	Policy        json.RawMessage `json:"policy,omitempty"`
	PolicyVersion uint64          `json:"policyVersion,omitempty"`
	// PolicyName names the library policy (a Policy resource) the sandbox runs under.
	PolicyName string `json:"policyName,omitempty"`
	// PinnedPolicy holds PolicyName at the version a snapshot captured (a restored
	// sandbox): the data plane enforces its document, not the Policy resource's
	// current version, until the policy API changes the sandbox's policy.
	PinnedPolicy    *PolicyPin `json:"pinnedPolicy,omitempty"`
	RenewOnAccess   int        `json:"renewOnAccess,omitempty"`
	CredentialProxy bool       `json:"credentialProxy,omitempty"`
	// Pool names the warm pool of a member not yet claimed.
	Pool string `json:"pool,omitempty"`
	// Owner is the id of the principal (API key) that created the sandbox; a user
	// principal reaches only the sandboxes it owns.
	Owner string `json:"owner,omitempty"`
	// SnapshotID is the snapshot the sandbox was restored from.
	SnapshotID string `json:"snapshotId,omitempty"`
	// SignedURLEpoch is covered by the tag of every signed URL minted for the sandbox;
	// revoking the sandbox's signed URLs increments it.
	SignedURLEpoch uint64 `json:"signedUrlEpoch,omitempty"`
}

// Platform is the OS/architecture constraint.
type Platform struct {
	OS   string `json:"os"`
	Arch string `json:"arch"`
}

// SandboxStatus is what lifecycle observed of the sandbox and its pod.
type SandboxStatus struct {
	// SandboxStatus is the lifecycle API's status of the sandbox; History the previous
	// ones, oldest first (at most 16).
	SandboxStatus *State  `json:"sandboxStatus,omitempty"`
	History       []State `json:"history,omitempty"`
	// ContainerID names the pod (or container) that runs the sandbox.
	ContainerID string `json:"containerID,omitempty"`
	// Address and Address6 are the pod's IPv4 and IPv6 addresses.
	Address  string `json:"address,omitempty"`
	Address6 string `json:"address6,omitempty"`
	// Node is the pod's node (spec.nodeName).
	Node          string `json:"node,omitempty"`
	Pid           int    `json:"pid,omitempty"`
	HostInterface string `json:"hostInterface,omitempty"`
	// PodUID is the pod's UID, by which egressd finds the pod's cgroup.
	PodUID string `json:"podUID,omitempty"`
	// HostIP is the address of the pod's node (status.hostIP).
	HostIP        string   `json:"hostIP,omitempty"`
	DeleteVolumes []string `json:"deleteVolumes,omitempty"`
	// Events is the sandbox's diagnostic event ring, oldest first (at most 64): what
	// lifecycle did and saw (create, state transitions, policy versions, egress
	// attached).
	Events []Event `json:"events,omitempty"`
	// Proposal is the last decision on the sandbox's policy proposal (lifecycle's
	// ProposalMark): later proposals read the audit records after LastSeq.
	Proposal *ProposalMark `json:"proposal,omitempty"`
	// Claiming marks a warm pool claim stored before its answer (lifecycle's
	// record.Claiming): a leader that finds it asks execd whether the claim released it.
	Claiming bool `json:"claiming,omitempty"`
}

// PolicyPin is a sandbox's named policy held at one library version (lifecycle's
// policyPin).
type PolicyPin struct {
	// Version is the library version of the named policy that Policy is.
	Version uint64 `json:"version"`
	// SHA256 is the hex SHA-256 of the policy file at Version.
	SHA256 string `json:"sha256,omitempty"`
	// SnapshotID is the snapshot that captured Policy.
	SnapshotID string `json:"snapshotId,omitempty"`
	// Policy is the named policy's document at Version (Airlock JSON form).
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	Policy json.RawMessage `json:"policy"`
}

// ProposalMark is the last decision on a sandbox's policy proposal
// (lifecycle.ProposalMark).
type ProposalMark struct {
	// Decision is approve or reject.
	Decision string `json:"decision"`
	// Digest is the hex SHA-256 of the decided proposal's YAML.
	Digest string `json:"digest"`
	// LastSeq is the last audit record seq the decided proposal read.
	LastSeq uint64 `json:"lastSeq"`
	// Principal is the id of the principal that decided.
	Principal string `json:"principal,omitempty"`
	// +kubebuilder:validation:Format=date-time
	At string `json:"at"`
	// SavedAs is the library policy the approval wrote, if any.
	SavedAs string `json:"savedAs,omitempty"`
}

// Event is one diagnostic event of a sandbox (lifecycle.Event).
type Event struct {
	// +kubebuilder:validation:Format=date-time
	Time    string `json:"time"`
	Source  string `json:"source"`
	Type    string `json:"type"`
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
}

// State is one status of a sandbox (the lifecycle API's SandboxStatus).
type State struct {
	State   string `json:"state"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// +kubebuilder:validation:Format=date-time
	LastTransitionAt string `json:"lastTransitionAt,omitempty"`
}

// SandboxList is a list of Sandbox.
//
// +kubebuilder:object:root=true
type SandboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Sandbox `json:"items"`
}

// Policy is the applied version of one named policy of the operator's library: lifecycle
// replicas agree on versions through it.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=apol,categories=airlock
// +kubebuilder:printcolumn:name="Policy",type=string,JSONPath=`.spec.name`
// +kubebuilder:printcolumn:name="Version",type=integer,JSONPath=`.spec.version`
type Policy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec PolicySpec `json:"spec"`
}

// PolicySpec is a named policy's applied version (policies/library.Stored).
type PolicySpec struct {
	// Name is the policy's name in the library (the resource name is derived from it).
	Name    string `json:"name"`
	Version uint64 `json:"version"`
	SHA256  string `json:"sha256"`
	File    string `json:"file,omitempty"`
	// Source is the policy file's text as applied (base64 in JSON).
	Source []byte `json:"source,omitempty"`
}

// PolicyList is a list of Policy.
//
// +kubebuilder:object:root=true
type PolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Policy `json:"items"`
}
