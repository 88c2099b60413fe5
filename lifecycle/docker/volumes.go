package docker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/airlockdev/airlock/lifecycle"
)

// createdVolumes are the named volumes one create made.
type createdVolumes struct {
	all            []string // every volume this create made (removed when it fails)
	deleteOnRemove []string // those to remove with the sandbox
}

// mounts turns the sandbox's volumes into Docker mounts: host paths only under the
// allowed roots (symlinks resolved), named volumes created when missing (unless
// createIfNotExists is false), subPath on a named volume as a bind mount of a
// directory inside the volume (the engine's API 1.41 has no volume subpath).
func (r *Runtime) mounts(ctx context.Context, spec lifecycle.Spec) (out []mount.Mount, created createdVolumes, err error) {
	defer func() {
		if err != nil {
			r.removeVolumes(context.WithoutCancel(ctx), createdVolumes{deleteOnRemove: created.all})
			created = createdVolumes{}
		}
	}()
	for _, v := range spec.Volumes {
		switch {
		case v.Host != nil:
			src, err := r.hostPath(v.Name, filepath.Join(v.Host.Path, v.SubPath))
			if err != nil {
				return nil, created, err
			}
			out = append(out, mount.Mount{Type: mount.TypeBind, Source: src, Target: v.MountPath, ReadOnly: v.ReadOnly})
		case v.PVC != nil:
			name := v.PVC.ClaimName
			res, err := r.cli.VolumeInspect(ctx, name, client.VolumeInspectOptions{})
			if cerrdefs.IsNotFound(err) {
				if v.PVC.CreateIfNotExists != nil && !*v.PVC.CreateIfNotExists {
					return nil, created, fmt.Errorf("%w: volume %q: named volume %q does not exist and createIfNotExists is false", lifecycle.ErrInvalidVolume, v.Name, name)
				}
				_, err = r.cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: name, Labels: map[string]string{
					LabelManagedBy: "airlock", LabelSandboxID: spec.SandboxID, LabelInstance: r.cfg.Instance,
				}})
				if err != nil {
					return nil, created, fmt.Errorf("docker: creating volume %s: %w", name, err)
				}
				created.all = append(created.all, name)
				if v.PVC.DeleteOnSandboxTermination {
					created.deleteOnRemove = append(created.deleteOnRemove, name)
				}
				res, err = r.cli.VolumeInspect(ctx, name, client.VolumeInspectOptions{})
			}
			if err != nil {
				return nil, created, fmt.Errorf("docker: inspecting volume %s: %w", name, err)
			}
			if v.SubPath == "" {
				out = append(out, mount.Mount{Type: mount.TypeVolume, Source: name, Target: v.MountPath, ReadOnly: v.ReadOnly})
				continue
			}
			if res.Volume.Driver != "local" || res.Volume.Mountpoint == "" {
				return nil, created, fmt.Errorf("%w: volume %q: subPath needs a local-driver volume", lifecycle.ErrInvalidVolume, v.Name)
			}
			src, err := subdir(res.Volume.Mountpoint, v.SubPath)
			if err != nil {
				return nil, created, fmt.Errorf("%w: volume %q: %v", lifecycle.ErrInvalidVolume, v.Name, err)
			}
			out = append(out, mount.Mount{Type: mount.TypeBind, Source: src, Target: v.MountPath, ReadOnly: v.ReadOnly})
		}
	}
	return out, created, nil
}

// hostPath resolves p and checks it lies under an allowed root.
func (r *Runtime) hostPath(name, p string) (string, error) {
	if len(r.cfg.AllowedHostRoots) == 0 {
		return "", fmt.Errorf("%w: volume %q: host-path volumes are disabled on this server", lifecycle.ErrInvalidVolume, name)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("%w: volume %q: host path %s does not exist", lifecycle.ErrInvalidVolume, name, p)
	}
	for _, root := range r.cfg.AllowedHostRoots {
		rr, err := filepath.EvalSymlinks(root)
		if err != nil {
			continue
		}
		if within(rr, real) {
			return real, nil
		}
	}
	return "", fmt.Errorf("%w: volume %q: host path %s is not under an allowed root (%s)", lifecycle.ErrInvalidVolume,
		name, p, strings.Join(r.cfg.AllowedHostRoots, ", "))
}

// subdir creates sub inside the volume directory base and returns its resolved path,
// refusing symlinks that leave base.
func subdir(base, sub string) (string, error) {
	rb, err := filepath.EvalSymlinks(base)
	if err != nil {
		return "", err
	}
	p := filepath.Join(rb, sub)
	if !within(rb, p) {
		return "", fmt.Errorf("subPath %q leaves the volume", sub)
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		return "", fmt.Errorf("subPath %q: %v", sub, err)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil || !within(rb, real) {
		return "", fmt.Errorf("subPath %q leaves the volume", sub)
	}
	return real, nil
}

func within(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../") && !filepath.IsAbs(rel)
}

// removeVolumes removes the named volumes, logging failures.
func (r *Runtime) removeVolumes(ctx context.Context, c createdVolumes) {
	for _, name := range c.deleteOnRemove {
		if _, err := r.cli.VolumeRemove(ctx, name, client.VolumeRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			r.log.Warn("removing volume failed", "volume", name, "err", err)
		}
	}
}
