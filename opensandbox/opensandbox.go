// Package opensandbox is the home of the OpenSandbox protocol's constants and the wire
// types that Airlock's servers and its Go SDK share: the well-known sandbox ports, the
// header names, the sandbox states, the JSON error envelope and execd's hold-release
// extension. The gateway, lifecycle, execd, egressd and the SDK import it instead of
// each other. It depends on the standard library only.
//
// Sources: docs/spec/sandbox-lifecycle.yml (lifecycle REST, SandboxState,
// ErrorResponse), docs/spec/execd-api.yaml (execd on port 44772), docs/spec/NOTES.md
// (the behaviours the specs leave out, the egress API on port 18080).
package opensandbox

// Well-known sandbox ports (docs/spec/NOTES.md).
const (
	// ExecdPort is execd's port inside every sandbox (execd-api.yaml). It is a control
	// port: never reachable without a credential.
	ExecdPort = 44772
	// EgressAPIPort is the OpenSandbox egress API's port (GET/PATCH/DELETE /policy). On
	// Airlock no sidecar listens there: lifecycle and the gateway answer it. It is a
	// control port as well.
	EgressAPIPort = 18080
	// CDPPort is the Chrome DevTools Protocol's port (HTTP /json/* and WebSockets) of a
	// browser sandbox, as OpenSandbox's browser examples and Airlock's airlock/browser
	// image use it. Whoever reaches it drives the browser (and so everything the
	// sandbox's egress policy lets it reach): a control port too. The gateway rewrites
	// the DevTools URLs in its /json answers to its own (gateway/README.md).
	CDPPort = 9222
	// VNCPort is a desktop sandbox's VNC (RFB) port, as OpenSandbox's desktop example
	// and Airlock's airlock/desktop image use it. VNC drives the desktop: a control
	// port, so the VNC server needs no password of its own.
	VNCPort = 5900
	// NoVNCPort is a desktop sandbox's noVNC port (websockify: noVNC's web page and the
	// VNC stream as a WebSocket), as airlock/desktop and OpenSandbox's desktop example
	// use it. A control port, like VNCPort.
	NoVNCPort = 6080
)

// IsControlPort reports whether port is one of the sandbox's control ports (execd, the
// egress API, the DevTools protocol, VNC or noVNC), which always require a credential
// whatever the sandbox's access mode.
func IsControlPort(port int) bool {
	switch port {
	case ExecdPort, EgressAPIPort, CDPPort, VNCPort, NoVNCPort:
		return true
	}
	return false
}

// ControlPorts are the ports IsControlPort reports, in ascending order.
var ControlPorts = []int{VNCPort, NoVNCPort, CDPPort, EgressAPIPort, ExecdPort}

// Header names in canonical MIME form (net/http canonicalises what clients send, so
// "OPEN-SANDBOX-API-KEY" and "open-sandbox-api-key" both arrive as HeaderAPIKey).
const (
	// HeaderAPIKey carries the lifecycle API key (sandbox-lifecycle.yml, securitySchemes).
	HeaderAPIKey = "Open-Sandbox-Api-Key"
	// HeaderSecureAccess carries a sandbox's access token (OpenSandbox OSEP-0011).
	HeaderSecureAccess = "Opensandbox-Secure-Access"
	// HeaderIngressTo routes a gateway request to "<id>-<port>" (OpenSandbox ingress).
	HeaderIngressTo = "Opensandbox-Ingress-To"
	// HeaderExecdAccessToken carries a sandbox's execd credential (execd-api.yaml,
	// securitySchemes AccessToken: X-EXECD-ACCESS-TOKEN). OpenSandbox SDKs send it to
	// execd as the endpoint of port 44772 lists it; Airlock's gateway and server proxy
	// accept it for that port of that sandbox and send it upstream themselves.
	HeaderExecdAccessToken = "X-Execd-Access-Token"
	// HeaderAccessToken is Airlock's own header for a sandbox's access token.
	HeaderAccessToken = "X-Airlock-Access-Token"
	// HeaderSandbox and HeaderPort route a gateway request (Airlock's header form).
	HeaderSandbox = "X-Airlock-Sandbox"
	HeaderPort    = "X-Airlock-Port"
	// HeaderRequestID names a request in logs, audit records and error bodies.
	HeaderRequestID = "X-Request-Id"
)

// State is an OpenSandbox lifecycle state (sandbox-lifecycle.yml, SandboxState).
type State string

// The states a sandbox goes through.
const (
	Pending    State = "Pending"
	Running    State = "Running"
	Pausing    State = "Pausing"
	Paused     State = "Paused"
	Resuming   State = "Resuming"
	Stopping   State = "Stopping"
	Terminated State = "Terminated"
	Failed     State = "Failed"
)

// States lists every state, in lifecycle order.
var States = []State{Pending, Running, Pausing, Paused, Resuming, Stopping, Terminated, Failed}

// Terminal reports whether no further transition (other than removal) happens.
func (s State) Terminal() bool { return s == Terminated || s == Failed }

// ReleasePath is where Airlock's lifecycle server releases a held sandbox's execd (an
// Airlock extension, not part of execd-api.yaml): POST with no body, 204 whether or not
// it was held; or POST with a JSON Release body, which only a held sandbox accepts (204;
// 409 ALREADY_EXISTS when it was released before; 400 for a malformed body). GET
// answers 200 with a ReleaseState and changes nothing. Both need execd's access token.
const ReleasePath = "/_airlock/release"

// ReleaseState is the answer of GET ReleasePath: whether the sandbox's execd is still
// held (its user processes not started). A lifecycle leader that finds a warm pool
// claim it did not see finish asks it.
type ReleaseState struct {
	Held bool `json:"held"`
}

// Release is the optional body of a release: what a sandbox created ahead of its
// request (a warm pool member) learns when it is claimed.
type Release struct {
	// Env is set in execd's own environment before anything of the user starts, so the
	// entrypoint, commands, sessions and kernels all inherit it.
	Env map[string]string `json:"env,omitempty"`
	// Entrypoint, when set, replaces the command execd was started with (--exec -- …)
	// as the supervised child.
	Entrypoint []string `json:"entrypoint,omitempty"`
}
