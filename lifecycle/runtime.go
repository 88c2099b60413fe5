package lifecycle

import (
	"context"
	"errors"
	"net/netip"
)

// Runtime runs sandboxes as containers (Docker) or pods. Every method performs I/O
// against the engine and may take seconds (Create can pull an image); callers pass a
// context with a deadline. The lifecycle server is the only caller and never calls two
// mutating methods on the same sandbox at once.
type Runtime interface {
	// Kind names the runtime for the watch API ("docker" or "kubernetes").
	Kind() string
	// Create makes the sandbox's container with execd as PID 1 wrapping Spec.Entrypoint,
	// starts it and returns where it runs. On error nothing is left behind. Errors wrap
	// ErrImageUnavailable, ErrInvalidVolume or ErrInvalidResources for bad input.
	Create(ctx context.Context, spec Spec) (Instance, error)
	// Remove kills and removes the container (also when paused) and the volumes it
	// created for the sandbox that ask to be deleted. A missing container is not an error.
	Remove(ctx context.Context, inst Instance) error
	// Pause freezes every process of the sandbox (cgroup freezer); Resume thaws them.
	// A runtime without a pause mechanism returns an error wrapping ErrNotImplemented.
	Pause(ctx context.Context, containerID string) error
	Resume(ctx context.Context, containerID string) error
	// Inspect returns the container's current view; ErrInstanceGone when it is missing.
	Inspect(ctx context.Context, containerID string) (Instance, error)
	// List returns every container this lifecycle instance created (by label), in any
	// state.
	List(ctx context.Context) ([]Instance, error)
}

// PauseChecker is implemented by a Runtime that knows before trying that it cannot pause
// at all (the Kubernetes runtime without snapshots). CanPause returns nil, or an
// error wrapping ErrNotImplemented whose text names the alternative; Server.Pause and
// Server.Resume then answer it (501) at once, without moving the sandbox through
// Pausing or Resuming or recording a runtime error on it.
type PauseChecker interface {
	CanPause() error
}

// RecreatingPauser is implemented by a Runtime that pauses a sandbox by capturing it
// and removing its workload, and resumes it by making the workload anew from that
// capture under the same sandbox id (Kubernetes: a pod cannot be frozen, so Pause
// commits the pod's container into a node-local image and deletes the pod, keeping
// its NetworkPolicy and Secrets; Resume makes the pod again from that image on that
// node). A Paused sandbox of such a runtime has no address; its resumed workload gets
// new addresses and its execd starts held, so Server.Resume takes it through a
// create's readiness (address, egress enforced, execd /ping, release) before Running,
// and Failed (ready_timeout) when that does not come. Pause may take as long as a
// snapshot's commit (snapshotTimeout). While paused, Inspect reports the sandbox
// PhasePaused; List may leave it out (it has no workload to list): reconcile and
// resync ask Inspect about each Pausing, Paused or Resuming sandbox List did not name
// (pausedAway).
type RecreatingPauser interface {
	Runtime
	// Resumed tells the runtime that the sandbox of inst is Running again after a
	// Resume (it stops reporting it paused); its error is logged only.
	Resumed(ctx context.Context, inst Instance) error
}

// RunningWaiter is implemented by runtimes whose containers get their address only
// once they run (Kubernetes: a pod's status); lifecycle's ready loop waits on it
// instead of asking Inspect every 100 ms. WaitRunning returns the container's view as
// Inspect does, once it is running with an address, or when ctx ends (ctx's error) or
// the container is gone (ErrInstanceGone) or exited (its view, not running).
type RunningWaiter interface {
	WaitRunning(ctx context.Context, containerID string) (Instance, error)
}

// ErrInstanceGone is returned by Runtime.Inspect for a container that no longer exists.
var ErrInstanceGone = errors.New("container not found")

// Spec is what the runtime needs to create one sandbox; lifecycle fills it from a
// validated create request.
type Spec struct {
	SandboxID string
	Image     string
	ImageAuth *ImageAuth
	// Entrypoint is the user's entrypoint; the runtime wraps it with execd.
	Entrypoint []string
	Env        map[string]string
	// NanoCPUs (10⁻⁹ CPUs), MemoryBytes and Pids are limits; 0 means the runtime's
	// default.
	NanoCPUs    int64
	MemoryBytes int64
	Pids        int64
	Volumes     []Volume
	// Platform, when set, must match what the runtime can run.
	Platform *PlatformSpec
	// TrustedCAPEM, when set, holds PEM CA certificates the sandbox must trust (the
	// credential proxy's interception CA): the runtime adds them to the image's system
	// trust store and points SSL_CERT_FILE, REQUESTS_CA_BUNDLE, GIT_SSL_CAINFO and
	// NODE_EXTRA_CA_CERTS at them. Never a key.
	TrustedCAPEM []byte
	// Hold starts execd held (execd --hold): the user's entrypoint and the execd API
	// wait until lifecycle's POST /_airlock/release, which the Server sends once the
	// sandbox's egress is enforced (Config.ReadyGate), so no process of the user runs
	// unfiltered. The Server sets it on every create.
	Hold bool
	// ExecdToken, when set, is the sandbox's execd credential (package
	// internal/execdtoken): the runtime hands execd its SHA-256 on the command line
	// (execd --access-token-sha256: Docker, and Kubernetes pods with the node's execd) or
	// the token in a file execd reads and removes at start (--access-token-file), never
	// through the environment, so execd then requires it in X-EXECD-ACCESS-TOKEN on
	// every request but GET /ping.
	ExecdToken string
	// OCIRuntime is the engine runtime this sandbox runs under ("runsc": gVisor), from
	// the create's ExtRuntime, checked against the engine (OCIRuntimes); empty: the
	// Runtime's default (docker.runtime).
	OCIRuntime string
	// Egress is what the sandbox's compiled policy allows, for runtimes that add a
	// second network layer (Kubernetes: a NetworkPolicy per sandbox). egressd stays the
	// enforcement of record.
	Egress Egress
}

// Egress summarises a compiled policy for a coarse second layer: the CIDR prefixes it
// allows, and whether it allows anything by name (FQDN rules, which only egressd can
// enforce: the second layer then admits every public address) or allows by default.
type Egress struct {
	CIDRs    []netip.Prefix
	ByName   bool
	AllowAll bool
}

// EgressUpdater is implemented by runtimes whose second layer follows policy changes
// (Kubernetes); lifecycle calls it after every change of a sandbox's effective policy.
type EgressUpdater interface {
	UpdateEgress(ctx context.Context, inst Instance, eg Egress) error
}

// EgressRepairer is an EgressUpdater that can tell which sandboxes lack their second
// layer (on Kubernetes a NetworkPolicy deleted by hand): the leader's resync (every
// Config.ResyncInterval) rewrites it with UpdateEgress.
type EgressRepairer interface {
	EgressUpdater
	// MissingEgress returns those of ids (sandbox ids) whose second layer is missing.
	MissingEgress(ctx context.Context, ids []string) ([]string, error)
}

// Instance is a sandbox's container as the runtime sees it.
type Instance struct {
	SandboxID   string
	ContainerID string
	// Address is the container's IPv4 address on the Airlock network; invalid when
	// stopped.
	Address netip.Addr
	// Address6 is its IPv6 address there when the network has IPv6 (Subnet6).
	Address6 netip.Addr
	// Pid is the container's PID 1 on the host, 0 when not running.
	Pid int
	// HostInterface is the host side of the sandbox's veth when the runtime knows it
	// (egressd otherwise finds it through Pid's network namespace).
	HostInterface string
	// PodUID is the pod's UID (Kubernetes; empty elsewhere): egressd finds the pod's
	// cgroup by it (kubelet names it pod<UID>) to refuse denied connections with EPERM.
	PodUID string
	// Phase is the container's runtime state.
	Phase Phase
	// Node is the node that runs the sandbox (Kubernetes: the pod's spec.nodeName);
	// empty on a single host.
	Node string
	// HostIP is the address of that node (Kubernetes: the pod's status.hostIP, once
	// bound); the gateway reaches the node's egressd there. Empty on a single host.
	HostIP string
	// DeleteVolumes are named volumes the runtime created for this sandbox and removes
	// with it.
	DeleteVolumes []string
}

// Phase is the container state as a runtime reports it.
type Phase string

// Container phases.
const (
	PhaseCreated Phase = "created"
	PhaseRunning Phase = "running"
	PhasePaused  Phase = "paused"
	PhaseExited  Phase = "exited"
)
