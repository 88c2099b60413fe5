// Package docker is the lifecycle server's Docker runtime
// (docs/architecture.md#lifecycle-and-runtimes): every sandbox is a container on a
// dedicated bridge network (airlock0 by default, inter-container traffic disabled) with
// execd copied in before start (once per image, into a cached template image one layer
// above it: template.go) and running as PID 1 (/opt/airlock/execd --exec -- <user
// entrypoint>), resource limits, dropped capabilities, no-new-privileges and an optional
// OCI runtime (runsc, kata). Pause and resume use the cgroup freezer (docker pause). It
// talks to the engine through github.com/moby/moby/client.
package docker

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/airlockdev/airlock/internal/cgroupv2"
	"github.com/airlockdev/airlock/lifecycle"
)

// Labels every Airlock container carries.
const (
	LabelSandboxID = "airlock.dev/sandbox-id"
	LabelInstance  = "airlock.dev/instance"
	LabelManagedBy = "airlock.dev/managed-by"
)

// execdArgs is execd's command line in front of the user's entrypoint; maxPTY is
// Config.MaxPTYSessions (0: execd's default); token, when set, is the sandbox's execd
// token, of which execd gets only the SHA-256 (tokenFlags).
func execdArgs(hold bool, token string, maxPTY int) []string {
	args := []string{ExecdPath, "--exec"}
	if hold {
		args = append(args, "--hold")
	}
	if maxPTY != 0 {
		args = append(args, "--max-pty-sessions", strconv.Itoa(maxPTY))
	}
	args = append(args, tokenFlags(token)...)
	return append(args, "--")
}

// ExecdPath is where execd lives inside every sandbox.
const ExecdPath = "/opt/airlock/execd"

// DroppedCapabilities are removed from every sandbox on top of Docker's defaults.
var DroppedCapabilities = []string{
	"NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_MODULE", "SYS_PTRACE", "MKNOD",
	"SYS_BOOT", "SYS_TIME", "SYS_RAWIO", "AUDIT_WRITE",
}

// Config configures the Docker runtime.
type Config struct {
	// Client talks to the engine; New makes one from the environment (DOCKER_HOST)
	// when nil. The Runtime closes only a client it made.
	Client *client.Client
	// Instance is the lifecycle instance id (label airlock.dev/instance): List returns
	// only containers carrying it. Required.
	Instance string
	// Network is the bridge network's name, also the Linux bridge name (at most 15
	// characters); default "airlock0". Subnet, when valid, is its IPv4 subnet for a
	// network that does not exist yet; otherwise Docker picks one.
	Network string
	Subnet  netip.Prefix
	// Subnet6, when valid, gives a new network IPv6 too (a ULA /64, e.g.
	// fd00:a1e::/64): sandboxes are dual stack and egress filters both families.
	Subnet6 netip.Prefix
	// ExecdPath is the static execd binary on this host, copied into every sandbox.
	// Required.
	ExecdPath string
	// MaxPTYSessions is execd's --max-pty-sessions in every sandbox: the PTY sessions a
	// sandbox may have at once (POST /pty past it: 409 PTY_LIMIT_EXCEEDED). 0: execd's
	// default (execd.DefaultMaxPTYSessions, 16); negative: no limit.
	MaxPTYSessions int
	// OCIRuntime names the engine runtime sandboxes run under unless their create names
	// another (lifecycle.ExtRuntime): "runsc" is gVisor (README.md#gvisor); empty is the
	// engine's default (runc). Setup fails when the engine does not have it.
	OCIRuntime string
	// AllowedHostRoots are the host directories under which host-path volumes may be
	// mounted (after resolving symlinks). Empty disables host-path volumes.
	AllowedHostRoots []string
	// NamePrefix starts every container name; default "airlock-".
	NamePrefix string
	// DNS, when set, are the sandboxes' resolvers (egressd on the bridge gateway).
	DNS []netip.Addr
	// DNSOnGateway makes the network's gateway address (the host's side of the bridge,
	// where egressd's DNS filter listens) the sandboxes' only resolver; it is known only
	// after Setup, so it cannot be written into DNS beforehand.
	DNSOnGateway bool
	Log          *slog.Logger
}

// Runtime implements lifecycle.Runtime on a Docker engine.
type Runtime struct {
	cfg    Config
	cli    *client.Client
	ownCli bool
	log    *slog.Logger
	execd  []byte // tar archive holding opt/airlock/execd
	// templates are the images with execd already in them, per base image.
	templates *templates
	// bundles are the images' own trust bundles (trust.go).
	bundles bundleCache
	gateway netip.Addr
	subnet  netip.Prefix
	// gateway6 and subnet6 are the network's IPv6, invalid without.
	gateway6 netip.Addr
	subnet6  netip.Prefix
}

var (
	_ lifecycle.Runtime     = (*Runtime)(nil)
	_ lifecycle.OCIRuntimes = (*Runtime)(nil)
)

// New checks cfg, reads execd and returns a Runtime; call Setup before use.
func New(cfg Config) (*Runtime, error) {
	if cfg.Instance == "" || cfg.ExecdPath == "" {
		return nil, errors.New("docker: Instance and ExecdPath are required")
	}
	if cfg.Network == "" {
		cfg.Network = "airlock0"
	}
	if len(cfg.Network) > 15 {
		return nil, fmt.Errorf("docker: network name %q is longer than a Linux interface name (15)", cfg.Network)
	}
	if cfg.NamePrefix == "" {
		cfg.NamePrefix = "airlock-"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	tarball, err := execdArchive(cfg.ExecdPath)
	if err != nil {
		return nil, err
	}
	r := &Runtime{cfg: cfg, cli: cfg.Client, log: cfg.Log, execd: tarball, templates: newTemplates(tarball)}
	if r.cli == nil {
		if r.cli, err = client.New(client.FromEnv); err != nil {
			return nil, fmt.Errorf("docker: %w", err)
		}
		r.ownCli = true
	}
	return r, nil
}

// Close releases the engine client when the Runtime made it.
func (r *Runtime) Close() error {
	if r.ownCli {
		return r.cli.Close()
	}
	return nil
}

// Kind is "docker".
func (r *Runtime) Kind() string { return "docker" }

// Setup makes sure the Airlock network exists: a bridge with inter-container traffic
// disabled. An existing network is used as it is (a warning is logged when it allows
// inter-container traffic).
func (r *Runtime) Setup(ctx context.Context) error {
	res, err := r.cli.NetworkInspect(ctx, r.cfg.Network, client.NetworkInspectOptions{})
	if cerrdefs.IsNotFound(err) {
		opts := client.NetworkCreateOptions{
			Driver: "bridge",
			Options: map[string]string{
				"com.docker.network.bridge.name":       r.cfg.Network,
				"com.docker.network.bridge.enable_icc": "false",
			},
			Labels: map[string]string{LabelManagedBy: "airlock"},
		}
		if r.cfg.Subnet.IsValid() || r.cfg.Subnet6.IsValid() {
			// The gateway explicitly: Docker 20.10 picks the first address but does not
			// report it in the network's IPAM config when only the subnet is given.
			opts.IPAM = &network.IPAM{}
			for _, sub := range []netip.Prefix{r.cfg.Subnet.Masked(), r.cfg.Subnet6.Masked()} {
				if sub.IsValid() {
					opts.IPAM.Config = append(opts.IPAM.Config, network.IPAMConfig{Subnet: sub, Gateway: sub.Addr().Next()})
				}
			}
		}
		if r.cfg.Subnet6.IsValid() {
			on := true
			opts.EnableIPv6 = &on
		}
		_, cerr := r.cli.NetworkCreate(ctx, r.cfg.Network, opts)
		// Another process may have created it meanwhile: what counts is that it exists.
		res, err = r.cli.NetworkInspect(ctx, r.cfg.Network, client.NetworkInspectOptions{})
		if err != nil && cerr != nil {
			return fmt.Errorf("docker: creating network %s: %w", r.cfg.Network, cerr)
		}
		if cerr == nil {
			r.log.Info("network created", "network", r.cfg.Network, "subnet", r.cfg.Subnet)
		}
	}
	if err != nil {
		return fmt.Errorf("docker: inspecting network %s: %w", r.cfg.Network, err)
	}
	if res.Network.Driver != "bridge" {
		return fmt.Errorf("docker: network %s is a %s network, want bridge", r.cfg.Network, res.Network.Driver)
	}
	if res.Network.Options["com.docker.network.bridge.enable_icc"] != "false" {
		r.log.Warn("network allows inter-container traffic; recreate it to isolate sandboxes", "network", r.cfg.Network)
	}
	for _, c := range res.Network.IPAM.Config {
		gw := c.Gateway
		if !gw.IsValid() {
			// Created elsewhere with a subnet only: the engine's default gateway is the
			// subnet's first address.
			gw = c.Subnet.Masked().Addr().Next()
		}
		if c.Subnet.Addr().Is4() {
			r.subnet, r.gateway = c.Subnet, gw
		} else if res.Network.EnableIPv6 {
			r.subnet6, r.gateway6 = c.Subnet, gw
		}
	}
	if r.cfg.Subnet6.IsValid() && !r.subnet6.IsValid() {
		r.log.Warn("network has no IPv6; recreate it for dual-stack sandboxes", "network", r.cfg.Network, "subnet6", r.cfg.Subnet6)
	}
	if name := r.cfg.OCIRuntime; name != "" {
		have, err := r.OCIRuntimes(ctx)
		if err != nil {
			return err
		}
		if !slices.Contains(have, name) {
			return fmt.Errorf("docker: the engine has no runtime %q (it has: %s); make prepare registers runsc, or add it to /etc/docker/daemon.json \"runtimes\" and reload the engine",
				name, strings.Join(have, ", "))
		}
	}
	r.removeStaleTemplates(ctx)
	return nil
}

// OCIRuntimes implements lifecycle.OCIRuntimes: the runtimes registered with the
// engine (GET /info), sorted.
func (r *Runtime) OCIRuntimes(ctx context.Context) ([]string, error) {
	res, err := r.cli.Info(ctx, client.InfoOptions{})
	if err != nil {
		return nil, fmt.Errorf("docker: engine info: %w", err)
	}
	return slices.Sorted(maps.Keys(res.Info.Runtimes)), nil
}

// Network6 returns the Airlock network's IPv6 subnet and gateway, invalid when the
// network has no IPv6; known after Setup.
func (r *Runtime) Network6() (subnet netip.Prefix, gateway netip.Addr) {
	return r.subnet6, r.gateway6
}

// Network returns the Airlock network's name, IPv4 subnet and gateway (the host's
// address on it), known after Setup.
func (r *Runtime) Network() (name string, subnet netip.Prefix, gateway netip.Addr) {
	return r.cfg.Network, r.subnet, r.gateway
}

// Create implements lifecycle.Runtime.
func (r *Runtime) Create(ctx context.Context, spec lifecycle.Spec) (inst lifecycle.Instance, err error) {
	baseID, err := r.ensureImage(ctx, spec.Image, spec.ImageAuth)
	if err != nil {
		return inst, err
	}
	image, copyExecd := spec.Image, false
	if tmpl, err := r.templateRef(ctx, baseID); err == nil {
		image = tmpl
	} else {
		r.log.Warn("no execd template image; copying execd into the container", "image", spec.Image, "err", err)
		copyExecd = true
	}
	mounts, created, err := r.mounts(ctx, spec)
	if err != nil {
		return inst, err
	}
	defer func() {
		if err != nil {
			r.removeVolumes(context.WithoutCancel(ctx), created)
		}
	}()
	envs := maps.Clone(spec.Env)
	if len(spec.TrustedCAPEM) > 0 {
		if envs == nil {
			envs = map[string]string{}
		}
		maps.Copy(envs, trustEnv())
	}
	env := make([]string, 0, len(envs))
	for _, k := range slices.Sorted(maps.Keys(envs)) {
		env = append(env, k+"="+envs[k])
	}
	pids := spec.Pids
	hc := &container.HostConfig{
		NetworkMode: container.NetworkMode(r.cfg.Network),
		CapDrop:     DroppedCapabilities,
		SecurityOpt: []string{"no-new-privileges"},
		Runtime:     cmp.Or(spec.OCIRuntime, r.cfg.OCIRuntime),
		Mounts:      mounts,
		Resources: container.Resources{
			NanoCPUs:  spec.NanoCPUs,
			Memory:    spec.MemoryBytes,
			PidsLimit: &pids,
		},
	}
	if spec.MemoryBytes > 0 {
		hc.Resources.MemorySwap = spec.MemoryBytes // no swap beyond the limit
	}
	for _, a := range r.cfg.DNS {
		hc.DNS = append(hc.DNS, a)
	}
	if r.cfg.DNSOnGateway && r.gateway.IsValid() {
		hc.DNS = []netip.Addr{r.gateway}
	}
	labels := map[string]string{
		LabelSandboxID: spec.SandboxID,
		LabelInstance:  r.cfg.Instance,
		LabelManagedBy: "airlock",
	}
	opts := client.ContainerCreateOptions{
		Name: r.cfg.NamePrefix + spec.SandboxID,
		Config: &container.Config{
			Image:      image,
			Entrypoint: append(execdArgs(spec.Hold, spec.ExecdToken, r.cfg.MaxPTYSessions), spec.Entrypoint...),
			Cmd:        nil,
			Env:        env,
			Labels:     labels,
			Hostname:   spec.SandboxID,
		},
		HostConfig: hc,
		NetworkingConfig: &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{
			r.cfg.Network: {},
		}},
	}
	cres, err := r.cli.ContainerCreate(ctx, opts)
	if err != nil && !copyExecd && cerrdefs.IsNotFound(err) {
		// The template went (removed by hand or by another instance's Setup): once more.
		r.templates.forget(baseID)
		if opts.Config.Image, err = r.templateRef(ctx, baseID); err == nil {
			cres, err = r.cli.ContainerCreate(ctx, opts)
		}
	}
	if err != nil {
		if cerrdefs.IsInvalidArgument(err) {
			return inst, fmt.Errorf("%w: %v", lifecycle.ErrInvalidRequest, err)
		}
		return inst, fmt.Errorf("docker: creating container: %w", err)
	}
	defer func() {
		if err != nil {
			if _, rmErr := r.cli.ContainerRemove(context.WithoutCancel(ctx), cres.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); rmErr != nil && !cerrdefs.IsNotFound(rmErr) {
				r.log.Error("removing half-created container failed", "container_id", cres.ID, "err", rmErr)
			}
			_ = cgroupv2.Release(cgroupName(cres.ID))
		}
	}()
	if copyExecd {
		if _, err = r.cli.CopyToContainer(ctx, cres.ID, client.CopyToContainerOptions{
			DestinationPath: "/",
			Content:         bytes.NewReader(r.execd),
		}); err != nil {
			return inst, fmt.Errorf("docker: copying execd into the container: %w", err)
		}
	}
	if len(spec.TrustedCAPEM) > 0 {
		imageID := baseID
		if len(mounts) > 0 {
			imageID = "" // a mount may cover the bundle: read it, never cache it
		}
		if err = r.installTrust(ctx, imageID, cres.ID, spec.TrustedCAPEM); err != nil {
			return inst, err
		}
	}
	if _, err = r.cli.ContainerStart(ctx, cres.ID, client.ContainerStartOptions{}); err != nil {
		return inst, fmt.Errorf("docker: starting container: %w", err)
	}
	inst, err = r.Inspect(ctx, cres.ID)
	if err != nil {
		return inst, err
	}
	if err = r.ownCgroup(inst); err != nil {
		return inst, err
	}
	inst.DeleteVolumes = created.deleteOnRemove
	return inst, nil
}

// ownCgroup gives a sandbox whose runtime left its process in the cgroup v2 root
// (gVisor's runsc on a hybrid host: README.md#gvisor) a v2 cgroup of its own,
// cgroupName, before lifecycle publishes it: egressd attaches the sandbox's socket
// programs there (it never attaches at the root). Held by execd, the sandbox has run
// nothing of the user's yet. A host without cgroup2 has nothing to do.
func (r *Runtime) ownCgroup(inst lifecycle.Instance) error {
	if inst.Pid <= 0 {
		return nil
	}
	dir, moved, err := cgroupv2.Adopt(inst.Pid, cgroupName(inst.ContainerID))
	if errors.Is(err, cgroupv2.ErrNoCgroup2) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("docker: giving the sandbox a cgroup v2 of its own: %w", err)
	}
	if moved {
		r.log.Debug("sandbox moved out of the cgroup v2 root", "container_id", shortID(inst.ContainerID), "cgroup", dir)
	}
	return nil
}

// cgroupName is the v2 cgroup ownCgroup makes for a container, relative to the
// hierarchy's mount.
func cgroupName(containerID string) string { return "airlock/" + containerID }

func shortID(id string) string { return id[:min(len(id), 12)] }

// ensureImage pulls ref when the engine does not have it and returns its image id.
func (r *Runtime) ensureImage(ctx context.Context, ref string, auth *lifecycle.ImageAuth) (string, error) {
	if res, err := r.cli.ImageInspect(ctx, ref); err == nil {
		return res.ID, nil
	} else if !cerrdefs.IsNotFound(err) {
		return "", fmt.Errorf("docker: inspecting image %s: %w", ref, err)
	}
	opts := client.ImagePullOptions{}
	if auth != nil {
		enc, err := encodeAuth(auth)
		if err != nil {
			return "", err
		}
		opts.RegistryAuth = enc
	}
	r.log.Info("pulling image", "image", ref)
	resp, err := r.cli.ImagePull(ctx, ref, opts)
	if err == nil {
		err = resp.Wait(ctx)
	}
	if err != nil {
		return "", fmt.Errorf("%w: %s is not on this host and pulling it failed: %v", lifecycle.ErrImageUnavailable, ref, err)
	}
	res, err := r.cli.ImageInspect(ctx, ref)
	if err != nil {
		return "", fmt.Errorf("%w: %s: pulled but not found: %v", lifecycle.ErrImageUnavailable, ref, err)
	}
	return res.ID, nil
}

// Remove implements lifecycle.Runtime.
func (r *Runtime) Remove(ctx context.Context, inst lifecycle.Instance) error {
	if inst.ContainerID != "" {
		// A frozen container cannot take the kill signal: thaw it first.
		_, _ = r.cli.ContainerUnpause(ctx, inst.ContainerID, client.ContainerUnpauseOptions{})
		_, err := r.cli.ContainerRemove(ctx, inst.ContainerID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		if err != nil && !cerrdefs.IsNotFound(err) && !isRemovalInProgress(err) {
			return fmt.Errorf("docker: removing container: %w", err)
		}
		if err := cgroupv2.Release(cgroupName(inst.ContainerID)); err != nil {
			r.log.Warn("removing the sandbox's cgroup", "container_id", shortID(inst.ContainerID), "err", err)
		}
	}
	r.removeVolumes(ctx, createdVolumes{deleteOnRemove: inst.DeleteVolumes})
	return nil
}

func isRemovalInProgress(err error) bool {
	return strings.Contains(err.Error(), "removal of container") && strings.Contains(err.Error(), "already in progress")
}

// Pause implements lifecycle.Runtime (cgroup freezer).
func (r *Runtime) Pause(ctx context.Context, id string) error {
	if _, err := r.cli.ContainerPause(ctx, id, client.ContainerPauseOptions{}); err != nil {
		return fmt.Errorf("docker: pausing container: %w", err)
	}
	return nil
}

// Resume implements lifecycle.Runtime.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	if _, err := r.cli.ContainerUnpause(ctx, id, client.ContainerUnpauseOptions{}); err != nil {
		return fmt.Errorf("docker: resuming container: %w", err)
	}
	return nil
}

// Inspect implements lifecycle.Runtime.
func (r *Runtime) Inspect(ctx context.Context, id string) (lifecycle.Instance, error) {
	res, err := r.cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if cerrdefs.IsNotFound(err) {
		return lifecycle.Instance{}, lifecycle.ErrInstanceGone
	}
	if err != nil {
		return lifecycle.Instance{}, fmt.Errorf("docker: inspecting container: %w", err)
	}
	c := res.Container
	inst := lifecycle.Instance{ContainerID: c.ID}
	if c.Config != nil {
		inst.SandboxID = c.Config.Labels[LabelSandboxID]
	}
	if c.State != nil {
		inst.Phase = phase(string(c.State.Status))
		inst.Pid = c.State.Pid
	}
	if c.NetworkSettings != nil {
		if ep := c.NetworkSettings.Networks[r.cfg.Network]; ep != nil {
			inst.Address, inst.Address6 = ep.IPAddress, ep.GlobalIPv6Address
		}
	}
	return inst, nil
}

// List implements lifecycle.Runtime. Pids are not reported (0); Inspect has them.
func (r *Runtime) List(ctx context.Context) ([]lifecycle.Instance, error) {
	res, err := r.cli.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: client.Filters{}.Add("label", LabelInstance+"="+r.cfg.Instance),
	})
	if err != nil {
		return nil, fmt.Errorf("docker: listing containers: %w", err)
	}
	out := make([]lifecycle.Instance, 0, len(res.Items))
	for _, c := range res.Items {
		inst := lifecycle.Instance{ContainerID: c.ID, SandboxID: c.Labels[LabelSandboxID], Phase: phase(string(c.State))}
		if c.NetworkSettings != nil {
			if ep := c.NetworkSettings.Networks[r.cfg.Network]; ep != nil {
				inst.Address, inst.Address6 = ep.IPAddress, ep.GlobalIPv6Address
			}
		}
		out = append(out, inst)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ContainerID < out[j].ContainerID })
	return out, nil
}

func phase(s string) lifecycle.Phase {
	switch s {
	case "running", "restarting":
		return lifecycle.PhaseRunning
	case "paused":
		return lifecycle.PhasePaused
	case "created":
		return lifecycle.PhaseCreated
	default:
		return lifecycle.PhaseExited
	}
}
