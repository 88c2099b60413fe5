package docker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// Template images: execd is copied (CopyToContainer) into a container of each sandbox
// image once, and that container is committed as an image one layer above it, tagged
// TemplateRepository:<execd hash>-<base image id>. Sandboxes of that image then start
// from the template and need no copy of their own (about 50 ms of a ~250 ms create on a
// local engine). A template is found again by its tag after a restart; a new execd
// gives new tags, and templates of other execd builds are removed at Setup when no
// container uses them.

// TemplateRepository names template images.
const TemplateRepository = "airlock/execd-template"

// LabelTemplate marks template images with their execd hash.
const LabelTemplate = "airlock.dev/execd-template"

// templates caches the template of each base image id, one build at a time per id.
type templates struct {
	mu    sync.Mutex
	byID  map[string]*templateBuild
	execd string // hex hash of the execd archive, 12 characters
}

type templateBuild struct {
	done chan struct{}
	ref  string
	err  error
}

func newTemplates(archive []byte) *templates {
	sum := sha256.Sum256(archive)
	return &templates{byID: map[string]*templateBuild{}, execd: hex.EncodeToString(sum[:])[:12]}
}

// templateRef returns the template image of base image id baseID (building it on first
// use); sandboxes created from it already hold execd.
func (r *Runtime) templateRef(ctx context.Context, baseID string) (string, error) {
	t := r.templates
	t.mu.Lock()
	b, ok := t.byID[baseID]
	if !ok {
		b = &templateBuild{done: make(chan struct{})}
		t.byID[baseID] = b
	}
	t.mu.Unlock()
	if ok {
		select {
		case <-b.done:
			return b.ref, b.err
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	b.ref, b.err = r.buildTemplate(context.WithoutCancel(ctx), baseID)
	if b.err != nil { // the next create tries again
		t.mu.Lock()
		delete(t.byID, baseID)
		t.mu.Unlock()
	}
	close(b.done)
	return b.ref, b.err
}

// settle waits until a build of baseID's template in flight, if any, has ended (or ctx).
func (t *templates) settle(ctx context.Context, baseID string) {
	t.mu.Lock()
	b, ok := t.byID[baseID]
	t.mu.Unlock()
	if !ok {
		return
	}
	select {
	case <-b.done:
	case <-ctx.Done():
	}
}

// forget drops the cached template of baseID.
func (t *templates) forget(baseID string) {
	t.mu.Lock()
	delete(t.byID, baseID)
	t.mu.Unlock()
}

// buildTemplate finds or makes the template of baseID.
func (r *Runtime) buildTemplate(ctx context.Context, baseID string) (string, error) {
	ref := fmt.Sprintf("%s:%s-%s", TemplateRepository, r.templates.execd, strings.TrimPrefix(baseID, "sha256:")[:12])
	if _, err := r.cli.ImageInspect(ctx, ref); err == nil {
		return ref, nil
	} else if !cerrdefs.IsNotFound(err) {
		return "", fmt.Errorf("docker: inspecting template %s: %w", ref, err)
	}
	cres, err := r.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{
			Image:      baseID,
			Entrypoint: []string{ExecdPath},
			Labels:     map[string]string{LabelManagedBy: "airlock", LabelTemplate: r.templates.execd},
		},
		HostConfig: &container.HostConfig{NetworkMode: "none"},
	})
	if err != nil {
		return "", fmt.Errorf("docker: creating the execd template container: %w", err)
	}
	defer func() {
		if _, err := r.cli.ContainerRemove(ctx, cres.ID, client.ContainerRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			r.log.Warn("removing the execd template container failed", "container_id", cres.ID, "err", err)
		}
	}()
	if _, err := r.cli.CopyToContainer(ctx, cres.ID, client.CopyToContainerOptions{
		DestinationPath: "/", Content: bytes.NewReader(r.execd),
	}); err != nil {
		return "", fmt.Errorf("docker: copying execd into the template container: %w", err)
	}
	if _, err := r.cli.ContainerCommit(ctx, cres.ID, client.ContainerCommitOptions{
		Reference: ref, NoPause: true, Comment: "Airlock: execd at " + ExecdPath,
	}); err != nil {
		return "", fmt.Errorf("docker: committing the execd template %s: %w", ref, err)
	}
	r.log.Info("execd template image built", "image", ref, "base", baseID)
	return ref, nil
}

// removeStaleTemplates removes template images of other execd builds that no container
// uses (the engine refuses those in use; they go at a later start).
func (r *Runtime) removeStaleTemplates(ctx context.Context) {
	res, err := r.cli.ImageList(ctx, client.ImageListOptions{Filters: client.Filters{}.Add("label", LabelTemplate)})
	if err != nil {
		return
	}
	for _, img := range res.Items {
		if img.Labels[LabelTemplate] == r.templates.execd {
			continue
		}
		for _, tag := range TemplateTags(img.Labels, img.RepoTags) {
			if _, err := r.cli.ImageRemove(ctx, tag, client.ImageRemoveOptions{}); err == nil {
				r.log.Info("stale execd template removed", "image", tag)
			}
		}
	}
}

// TemplateTags are the tags of an image carrying LabelTemplate that name an execd
// template: those in TemplateRepository, none of a snapshot image's. A snapshot is
// committed from a sandbox's container, and the engine's commit keeps the container's
// labels beside the ones given, the template's among them: by the label alone, a
// snapshot image looks like a template of the execd build it was taken under.
func TemplateTags(labels map[string]string, tags []string) []string {
	if labels[LabelSnapshot] != "" {
		return nil
	}
	var out []string
	for _, tag := range tags {
		if strings.HasPrefix(tag, TemplateRepository+":") {
			out = append(out, tag)
		}
	}
	return out
}
