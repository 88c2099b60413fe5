package docker

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/airlockdev/airlock/lifecycle"
)

// Snapshots (lifecycle.Snapshotter): docker commit of the sandbox's container, tagged
// SnapshotRepository:<snapshot id>. What the image holds and what it leaves out:
//
//   - The container's root filesystem as the sandbox left it: its own layer above the
//     execd template of its image (template.go).
//   - Not its volumes: host paths and named volumes are mounts, which a commit never
//     includes; nor /etc/hosts, /etc/resolv.conf and /etc/hostname (the engine's bind
//     mounts).
//   - Not the execd token: it is never in the container; execd gets its SHA-256 on its
//     command line (tokenFlags), which the image does not keep (no entrypoint).
//   - Not the credential proxy's CA (trustInstalled): a second, never started container
//     of the first commit gets the image's own SystemBundle back (the appended CA cut
//     off) and an empty ExtraCAPath, and is committed under the same tag; the restore's
//     own CA is installed again at its create.
//   - execd itself stays in the lower template layer, but a restore starts from the
//     template of the snapshot image, which copies the running build's execd above it.
//   - Image config: the container's env (the sandbox's, without the trust variables),
//     labels without Airlock's own, no entrypoint (lifecycle gives one at restore).
//
// The snapshot's template is built right after the commit, in the background (the
// snapshot is Ready without waiting for it); a restore that comes before it is done
// waits for that build, so the first restore starts from the template like the next.

// SnapshotRepository names snapshot images; LabelSnapshot marks them with their id.
const (
	SnapshotRepository = "airlock/snapshot"
	LabelSnapshot      = "airlock.dev/snapshot"
)

var _ lifecycle.Snapshotter = (*Runtime)(nil)

// Snapshot implements lifecycle.Snapshotter.
func (r *Runtime) Snapshot(ctx context.Context, inst lifecycle.Instance, snapshotID string, trustInstalled bool) (lifecycle.SnapshotArtifact, error) {
	var art lifecycle.SnapshotArtifact
	res, err := r.cli.ContainerInspect(ctx, inst.ContainerID, client.ContainerInspectOptions{})
	if err != nil {
		return art, fmt.Errorf("docker: inspecting the sandbox's container: %w", err)
	}
	c := res.Container
	if c.Config == nil {
		return art, fmt.Errorf("docker: container %s has no config", shortID(inst.ContainerID))
	}
	cfg := &container.Config{
		Env:        snapshotEnv(c.Config.Env, trustInstalled),
		WorkingDir: c.Config.WorkingDir,
		User:       c.Config.User,
		Labels:     map[string]string{LabelSnapshot: snapshotID, LabelManagedBy: "airlock"},
		Entrypoint: []string{},
		Cmd:        []string{},
	}
	for k, v := range c.Config.Labels {
		if !strings.HasPrefix(k, "airlock.dev/") {
			cfg.Labels[k] = v
		}
	}
	ref := SnapshotRepository + ":" + strings.ToLower(snapshotID)
	if _, err := r.cli.ContainerCommit(ctx, inst.ContainerID, client.ContainerCommitOptions{
		Reference: ref, Config: cfg, Comment: "Airlock snapshot " + snapshotID + " of sandbox " + inst.SandboxID,
	}); err != nil {
		return art, fmt.Errorf("docker: committing the sandbox's container: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = r.RemoveSnapshot(context.WithoutCancel(ctx), ref)
		}
	}()
	if trustInstalled {
		if err := r.dropTrust(ctx, ref, cfg); err != nil {
			return art, err
		}
	}
	snap, err := r.cli.ImageInspect(ctx, ref)
	if err != nil {
		return art, fmt.Errorf("docker: inspecting the snapshot image: %w", err)
	}
	art = lifecycle.SnapshotArtifact{Ref: ref, Bytes: snap.Size}
	if base, err := r.cli.ImageInspect(ctx, c.Image); err == nil && base.Size <= snap.Size {
		art.Bytes = snap.Size - base.Size
	}
	// The snapshot's execd template is built in the background, past Ready: a restore
	// that comes first waits for that one build (templateRef), RemoveSnapshot too.
	go func() {
		if _, err := r.templateRef(context.WithoutCancel(ctx), snap.ID); err != nil {
			r.log.Warn("no execd template for the snapshot; its restores copy execd", "snapshot_id", snapshotID, "err", err)
		}
	}()
	ok = true
	return art, nil
}

// snapshotEnv is the container's env for the snapshot image: without the trust
// variables when the runtime set them (trustEnv).
func snapshotEnv(env []string, trustInstalled bool) []string {
	if !trustInstalled {
		return env
	}
	drop := trustEnv()
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if _, set := drop[k]; !set {
			out = append(out, kv)
		}
	}
	return out
}

// dropTrust gives snapshot image ref its image's own trust store back: in a container of
// it that never starts, SystemBundle without the credential proxy's CA appended at the
// sandbox's create (read from ExtraCAPath) and an empty ExtraCAPath; the container is
// committed under ref again.
func (r *Runtime) dropTrust(ctx context.Context, ref string, cfg *container.Config) error {
	cres, err := r.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config:     &container.Config{Image: ref, Entrypoint: []string{ExecdPath}, Labels: maps.Clone(cfg.Labels)},
		HostConfig: &container.HostConfig{NetworkMode: "none"},
	})
	if err != nil {
		return fmt.Errorf("docker: creating the snapshot's clean-up container: %w", err)
	}
	defer func() {
		if _, err := r.cli.ContainerRemove(context.WithoutCancel(ctx), cres.ID, client.ContainerRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			r.log.Warn("removing the snapshot's clean-up container failed", "container_id", shortID(cres.ID), "err", err)
		}
	}()
	read := func(p string) ([]byte, error) {
		res, err := r.cli.CopyFromContainer(ctx, cres.ID, client.CopyFromContainerOptions{SourcePath: p})
		if cerrdefs.IsNotFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		defer res.Content.Close()
		return firstFile(res.Content)
	}
	ca, err := read(ExtraCAPath)
	if err != nil {
		return fmt.Errorf("docker: reading %s of the snapshot: %w", ExtraCAPath, err)
	}
	bundle, err := read(SystemBundle)
	if err != nil {
		return fmt.Errorf("docker: reading %s of the snapshot: %w", SystemBundle, err)
	}
	if len(ca) > 0 {
		bundle = bytes.TrimSuffix(bundle, ca)
	}
	if err := r.writeTrustStore(ctx, cres.ID, nil, bundle, nil); err != nil {
		return fmt.Errorf("docker: restoring the snapshot's trust store: %w", err)
	}
	if _, err := r.cli.ContainerCommit(ctx, cres.ID, client.ContainerCommitOptions{
		Reference: ref, Config: cfg, NoPause: true, Comment: "Airlock snapshot: the credential proxy's CA removed",
	}); err != nil {
		return fmt.Errorf("docker: committing the snapshot without the credential proxy's CA: %w", err)
	}
	return nil
}

// RemoveSnapshot implements lifecycle.Snapshotter: it untags the snapshot image and its
// execd template. Layers that sandboxes restored from it still use stay until those
// sandboxes go (the engine keeps them; `docker image prune` frees them afterwards).
func (r *Runtime) RemoveSnapshot(ctx context.Context, ref string) error {
	img, err := r.cli.ImageInspect(ctx, ref)
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("docker: inspecting snapshot image %s: %w", ref, err)
	}
	tmpl := fmt.Sprintf("%s:%s-%s", TemplateRepository, r.templates.execd, strings.TrimPrefix(img.ID, "sha256:")[:12])
	r.templates.settle(ctx, img.ID) // a template still being built would outlive the delete
	r.templates.forget(img.ID)
	if _, err := r.cli.ImageRemove(ctx, tmpl, client.ImageRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
		r.log.Warn("removing the snapshot's execd template failed", "image", tmpl, "err", err)
	}
	if _, err := r.cli.ImageRemove(ctx, ref, client.ImageRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("docker: removing snapshot image %s: %w", ref, err)
	}
	return nil
}
