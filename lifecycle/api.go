package lifecycle

import (
	"encoding/json"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
)

// Status is the wire form of a sandbox's status (SandboxStatus).
type Status struct {
	State            opensandbox.State `json:"state"`
	Reason           string            `json:"reason,omitempty"`
	Message          string            `json:"message,omitempty"`
	LastTransitionAt time.Time         `json:"lastTransitionAt"`
}

// ImageSpec is the wire form of the sandbox image (ImageSpec). Auth is accepted on
// create and never returned.
type ImageSpec struct {
	URI  string     `json:"uri"`
	Auth *ImageAuth `json:"auth,omitempty"`
}

// ImageAuth holds registry credentials for a private image.
type ImageAuth struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// PlatformSpec is the OS/architecture constraint (PlatformSpec).
type PlatformSpec struct {
	OS   string `json:"os"`
	Arch string `json:"arch"`
}

// Volume is one storage mount of a create request (Volume). Exactly one of Host, PVC
// (Docker: a named volume) is set; OSSFS is not supported and rejected.
type Volume struct {
	Name      string          `json:"name"`
	Host      *HostVolume     `json:"host,omitempty"`
	PVC       *PVCVolume      `json:"pvc,omitempty"`
	OSSFS     json.RawMessage `json:"ossfs,omitempty"`
	MountPath string          `json:"mountPath"`
	ReadOnly  bool            `json:"readOnly,omitempty"`
	SubPath   string          `json:"subPath,omitempty"`
}

// HostVolume is a bind mount of a host directory.
type HostVolume struct {
	Path string `json:"path"`
}

// PVCVolume is a platform-managed named volume.
type PVCVolume struct {
	ClaimName                  string `json:"claimName"`
	CreateIfNotExists          *bool  `json:"createIfNotExists,omitempty"`
	DeleteOnSandboxTermination bool   `json:"deleteOnSandboxTermination,omitempty"`
}

// CreateRequest is the body of POST /sandboxes (CreateSandboxRequest). Unknown fields
// are ignored, as the reference server does.
type CreateRequest struct {
	Image           *ImageSpec        `json:"image"`
	SnapshotID      string            `json:"snapshotId"`
	Platform        *PlatformSpec     `json:"platform"`
	Timeout         *int64            `json:"timeout"`
	ResourceLimits  map[string]string `json:"resourceLimits"`
	Env             map[string]string `json:"env"`
	Metadata        map[string]string `json:"metadata"`
	Entrypoint      []string          `json:"entrypoint"`
	NetworkPolicy   json.RawMessage   `json:"networkPolicy"`
	CredentialProxy *struct {
		Enabled bool `json:"enabled"`
	} `json:"credentialProxy"`
	SecureAccess bool              `json:"secureAccess"`
	Volumes      []Volume          `json:"volumes"`
	Extensions   map[string]string `json:"extensions"`
}

// Sandbox is the wire form of a sandbox (Sandbox, and CreateSandboxResponse without
// image). ExpiresAt is absent for manual cleanup.
type Sandbox struct {
	ID         string            `json:"id"`
	Image      *ImageSpec        `json:"image,omitempty"`
	SnapshotID string            `json:"snapshotId,omitempty"`
	Platform   *PlatformSpec     `json:"platform,omitempty"`
	Status     Status            `json:"status"`
	Metadata   map[string]string `json:"metadata"`
	Entrypoint []string          `json:"entrypoint"`
	ExpiresAt  *time.Time        `json:"expiresAt,omitempty"`
	CreatedAt  time.Time         `json:"createdAt"`
	// Airlock holds Airlock's additions to the protocol's Sandbox (an extra property,
	// which the schema allows; OpenSandbox clients ignore it); nil when it has none.
	Airlock *SandboxExtension `json:"airlock,omitempty"`
}

// SandboxExtension is the "airlock" property of a sandbox in answers.
type SandboxExtension struct {
	// CreatedBy is the id of the principal whose key created the sandbox (package
	// principal; "admin" for the configured key); absent for sandboxes created before
	// principals existed.
	CreatedBy string `json:"createdBy,omitempty"`
}

// ListResponse is the body of GET /sandboxes (ListSandboxesResponse).
type ListResponse struct {
	Items      []Sandbox  `json:"items"`
	Pagination Pagination `json:"pagination"`
}

// Pagination describes one page of a list (PaginationInfo).
type Pagination struct {
	Page        int  `json:"page"`
	PageSize    int  `json:"pageSize"`
	TotalItems  int  `json:"totalItems"`
	TotalPages  int  `json:"totalPages"`
	HasNextPage bool `json:"hasNextPage"`
}

// Endpoint is the body of GET /sandboxes/{id}/endpoints/{port}: a host[:port][/path]
// without scheme, and the headers a client must send.
type Endpoint struct {
	Endpoint string            `json:"endpoint"`
	Headers  map[string]string `json:"headers,omitempty"`
}

// RenewRequest is the body of POST /sandboxes/{id}/renew-expiration.
type RenewRequest struct {
	ExpiresAt *time.Time `json:"expiresAt"`
}

// RenewResponse answers a renewal.
type RenewResponse struct {
	ExpiresAt time.Time `json:"expiresAt"`
}
