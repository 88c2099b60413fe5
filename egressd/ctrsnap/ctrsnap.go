// Package ctrsnap commits a Kubernetes sandbox pod's container into an image on its
// node, through the node's containerd (its gRPC API on the node's socket, the API
// module github.com/containerd/containerd/api), as `docker commit` does on Docker. The
// node's egressd runs it for lifecycle (egressd.SnapshotHandler, watch.SnapshotPath).
//
// What the image holds: the base image's layers plus one layer, the difference between
// the container's active snapshot (its root filesystem as the sandbox left it) and the
// base image's top snapshot, computed by containerd's differ while the container's task
// is paused. Mounts are not in a snapshot: execd's emptyDir (execd, the trust bundle),
// the token's memory emptyDir, the user's volumes and the kubelet's /etc/hosts,
// /etc/resolv.conf and /etc/hostname are all left out (only their empty mount points
// remain). The image is stored node-locally in containerd's namespace (k8s.io for the
// kubelet's CRI), unpacked into the container's snapshotter, so a pod on this node with
// imagePullPolicy Never starts from it; it is never pushed to a registry.
package ctrsnap

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"time"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	diffapi "github.com/containerd/containerd/api/services/diff/v1"
	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	leasesapi "github.com/containerd/containerd/api/services/leases/v1"
	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The kubelet's (CRI's) labels on a pod's containers, which Commit checks.
const (
	LabelPodName       = "io.kubernetes.pod.name"
	LabelPodNamespace  = "io.kubernetes.pod.namespace"
	LabelContainerName = "io.kubernetes.container.name"
)

// LabelSnapshot marks the images Commit makes with the snapshot's id.
const LabelSnapshot = "airlock.dev/snapshot"

// ErrNotSandbox is Commit's error for a container that is not the named pod's
// container (its CRI labels differ) or does not exist.
var ErrNotSandbox = errors.New("ctrsnap: no such container of the sandbox's pod on this node")

// Client talks to one containerd; safe for concurrent use.
type Client struct {
	conn *grpc.ClientConn
	ns   string
}

// New returns a client of the containerd listening on socket (a path) for namespace
// (k8s.io: the kubelet's). It connects on first use.
func New(socket, namespace string) (*Client, error) {
	if socket == "" || namespace == "" {
		return nil, errors.New("ctrsnap: a socket and a namespace are required")
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return nil, fmt.Errorf("ctrsnap: %w", err)
	}
	return &Client{conn: conn, ns: namespace}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Request names the container to commit and the image to make.
type Request struct {
	// ContainerID is containerd's id of the container (the pod status's containerID
	// without "containerd://").
	ContainerID string
	// PodName, PodNamespace and ContainerName must match the container's CRI labels.
	PodName, PodNamespace, ContainerName string
	// Ref is the image name to create (replaced when it exists).
	Ref string
	// SnapshotID labels the image (LabelSnapshot).
	SnapshotID string
	// DropEnv are environment variables left out of the image's config (the runtime's
	// own, such as the trust variables pointing into execd's emptyDir).
	DropEnv []string
}

// Result is what Commit made: the image, its manifest's digest, and the bytes of its
// new layer (compressed), what the snapshot costs beyond its base image.
type Result struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
	Bytes  int64  `json:"bytes"`
}

func (c *Client) ctx(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "containerd-namespace", c.ns)
}

// Commit makes image req.Ref of the container (see the package comment). The
// container's task is paused while its layer is computed and resumed afterwards.
func (c *Client) Commit(ctx context.Context, req Request) (Result, error) {
	var res Result
	ctx = c.ctx(ctx)
	got, err := containersapi.NewContainersClient(c.conn).Get(ctx, &containersapi.GetContainerRequest{ID: req.ContainerID})
	if status.Code(err) == codes.NotFound {
		return res, ErrNotSandbox
	}
	if err != nil {
		return res, fmt.Errorf("ctrsnap: reading container %s: %w", req.ContainerID, err)
	}
	ctr := got.Container
	if l := ctr.Labels; l[LabelPodName] != req.PodName || l[LabelPodNamespace] != req.PodNamespace || l[LabelContainerName] != req.ContainerName {
		return res, ErrNotSandbox
	}
	// A lease keeps what is made here from containerd's garbage collector until the
	// image references it.
	lid := "airlock-snapshot-" + randomHex()
	leases := leasesapi.NewLeasesClient(c.conn)
	if _, err := leases.Create(ctx, &leasesapi.CreateRequest{ID: lid, Labels: map[string]string{
		"containerd.io/gc.expire": time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
	}}); err != nil {
		return res, fmt.Errorf("ctrsnap: creating a lease: %w", err)
	}
	defer func() {
		_, _ = leases.Delete(context.WithoutCancel(ctx), &leasesapi.DeleteRequest{ID: lid})
	}()
	ctx = metadata.AppendToOutgoingContext(ctx, "containerd-lease", lid)

	snaps := snapshotsapi.NewSnapshotsClient(c.conn)
	sn := ctr.Snapshotter
	info, err := snaps.Stat(ctx, &snapshotsapi.StatSnapshotRequest{Snapshotter: sn, Key: ctr.SnapshotKey})
	if err != nil {
		return res, fmt.Errorf("ctrsnap: the container's snapshot: %w", err)
	}
	parent := info.Info.Parent
	layer, err := c.diff(ctx, req.ContainerID, sn, ctr.SnapshotKey, parent)
	if err != nil {
		return res, err
	}
	diffID, err := c.uncompressed(ctx, layer.Digest)
	if err != nil {
		return res, err
	}

	base, err := imagesapi.NewImagesClient(c.conn).Get(ctx, &imagesapi.GetImageRequest{Name: ctr.Image})
	if err != nil {
		return res, fmt.Errorf("ctrsnap: the container's image %s: %w", ctr.Image, err)
	}
	mf, err := c.manifest(ctx, base.Image.Target)
	if err != nil {
		return res, err
	}
	var cfg ocispec.Image
	if err := c.readJSON(ctx, mf.Config.Digest.String(), &cfg); err != nil {
		return res, fmt.Errorf("ctrsnap: the image's config: %w", err)
	}
	if chainID(cfg.RootFS.DiffIDs) != parent {
		return res, fmt.Errorf("ctrsnap: the container's snapshot does not sit on its image's layers (parent %s)", parent)
	}
	env, err := containerEnv(ctr.Spec.GetValue(), req.DropEnv)
	if err != nil {
		return res, err
	}
	now := time.Now().UTC()
	cfg.Created = &now
	cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, digestOf(diffID))
	cfg.History = append(cfg.History, ocispec.History{Created: &now, CreatedBy: "airlock snapshot " + req.SnapshotID,
		Comment: "Airlock snapshot " + req.SnapshotID + " of pod " + req.PodNamespace + "/" + req.PodName})
	cfg.Config.Env = env
	cfg.Config.Entrypoint, cfg.Config.Cmd = nil, nil
	if cfg.Config.Labels == nil {
		cfg.Config.Labels = map[string]string{}
	}
	cfg.Config.Labels[LabelSnapshot] = req.SnapshotID
	chain := chainID(cfg.RootFS.DiffIDs)

	if err := c.unpack(ctx, sn, parent, chain, layer); err != nil {
		return res, err
	}
	cfgDesc, err := c.writeJSON(ctx, ocispec.MediaTypeImageConfig, cfg, map[string]string{"containerd.io/gc.ref.snapshot." + sn: chain})
	if err != nil {
		return res, err
	}
	mf.Config = cfgDesc
	mf.MediaType = ocispec.MediaTypeImageManifest
	mf.Layers = append(mf.Layers, ocispec.Descriptor{MediaType: layer.MediaType, Digest: digestOf(layer.Digest), Size: layer.Size})
	mf.Annotations = nil
	refs := map[string]string{"containerd.io/gc.ref.content.config": cfgDesc.Digest.String()}
	for i, l := range mf.Layers {
		refs[fmt.Sprintf("containerd.io/gc.ref.content.l.%d", i)] = l.Digest.String()
	}
	mfDesc, err := c.writeJSON(ctx, ocispec.MediaTypeImageManifest, mf, refs)
	if err != nil {
		return res, err
	}
	img := &imagesapi.Image{Name: req.Ref, Labels: map[string]string{LabelSnapshot: req.SnapshotID, "io.cri-containerd.image": "managed"},
		Target: &types.Descriptor{MediaType: mfDesc.MediaType, Digest: mfDesc.Digest.String(), Size: mfDesc.Size}}
	images := imagesapi.NewImagesClient(c.conn)
	if _, err := images.Create(ctx, &imagesapi.CreateImageRequest{Image: img}); status.Code(err) == codes.AlreadyExists {
		_, err = images.Update(ctx, &imagesapi.UpdateImageRequest{Image: img})
		if err != nil {
			return res, fmt.Errorf("ctrsnap: updating image %s: %w", req.Ref, err)
		}
	} else if err != nil {
		return res, fmt.Errorf("ctrsnap: creating image %s: %w", req.Ref, err)
	}
	return Result{Ref: req.Ref, Digest: mfDesc.Digest.String(), Bytes: layer.Size}, nil
}

// diff computes the layer of snapshot key over parent with the container's task
// paused (resumed before it returns).
func (c *Client) diff(ctx context.Context, containerID, sn, key, parent string) (*types.Descriptor, error) {
	snaps := snapshotsapi.NewSnapshotsClient(c.conn)
	tasks := tasksapi.NewTasksClient(c.conn)
	if _, err := tasks.Pause(ctx, &tasksapi.PauseTaskRequest{ContainerID: containerID}); err != nil {
		return nil, fmt.Errorf("ctrsnap: pausing the container: %w", err)
	}
	defer func() {
		// A task that ended meanwhile has nothing to resume: the error is not the commit's.
		_, _ = tasks.Resume(context.WithoutCancel(ctx), &tasksapi.ResumeTaskRequest{ContainerID: containerID})
	}()
	upper, err := snaps.Mounts(ctx, &snapshotsapi.MountsRequest{Snapshotter: sn, Key: key})
	if err != nil {
		return nil, fmt.Errorf("ctrsnap: the container's mounts: %w", err)
	}
	view := "airlock-snapshot-view-" + randomHex()
	lower, err := snaps.View(ctx, &snapshotsapi.ViewSnapshotRequest{Snapshotter: sn, Key: view, Parent: parent})
	if err != nil {
		return nil, fmt.Errorf("ctrsnap: a view of the image's layers: %w", err)
	}
	defer func() {
		_, _ = snaps.Remove(context.WithoutCancel(ctx), &snapshotsapi.RemoveSnapshotRequest{Snapshotter: sn, Key: view})
	}()
	d, err := diffapi.NewDiffClient(c.conn).Diff(ctx, &diffapi.DiffRequest{Left: lower.Mounts, Right: upper.Mounts,
		MediaType: ocispec.MediaTypeImageLayerGzip, Ref: "airlock-snapshot-layer-" + randomHex()})
	if err != nil {
		return nil, fmt.Errorf("ctrsnap: computing the container's layer: %w", err)
	}
	return d.Diff, nil
}

// unpack makes snapshot chain (layer applied over parent) unless it exists.
func (c *Client) unpack(ctx context.Context, sn, parent, chain string, layer *types.Descriptor) error {
	snaps := snapshotsapi.NewSnapshotsClient(c.conn)
	if _, err := snaps.Stat(ctx, &snapshotsapi.StatSnapshotRequest{Snapshotter: sn, Key: chain}); err == nil {
		return nil
	}
	key := "airlock-snapshot-unpack-" + randomHex()
	p, err := snaps.Prepare(ctx, &snapshotsapi.PrepareSnapshotRequest{Snapshotter: sn, Key: key, Parent: parent})
	if err != nil {
		return fmt.Errorf("ctrsnap: preparing the snapshot's layer: %w", err)
	}
	if _, err := diffapi.NewDiffClient(c.conn).Apply(ctx, &diffapi.ApplyRequest{Diff: layer, Mounts: p.Mounts}); err != nil {
		_, _ = snaps.Remove(context.WithoutCancel(ctx), &snapshotsapi.RemoveSnapshotRequest{Snapshotter: sn, Key: key})
		return fmt.Errorf("ctrsnap: unpacking the snapshot's layer: %w", err)
	}
	if _, err := snaps.Commit(ctx, &snapshotsapi.CommitSnapshotRequest{Snapshotter: sn, Name: chain, Key: key}); err != nil && status.Code(err) != codes.AlreadyExists {
		_, _ = snaps.Remove(context.WithoutCancel(ctx), &snapshotsapi.RemoveSnapshotRequest{Snapshotter: sn, Key: key})
		return fmt.Errorf("ctrsnap: committing the snapshot's layer: %w", err)
	}
	return nil
}

// Remove deletes image ref (its content and snapshots go with containerd's garbage
// collection once no other image or container uses them); a missing one is not an
// error.
func (c *Client) Remove(ctx context.Context, ref string) error {
	_, err := imagesapi.NewImagesClient(c.conn).Delete(c.ctx(ctx), &imagesapi.DeleteImageRequest{Name: ref, Sync: true})
	if err != nil && status.Code(err) != codes.NotFound {
		return fmt.Errorf("ctrsnap: removing image %s: %w", ref, err)
	}
	return nil
}

// manifest reads the image manifest target names: target itself, or the linux entry
// of this node's architecture of an index.
func (c *Client) manifest(ctx context.Context, target *types.Descriptor) (ocispec.Manifest, error) {
	var mf ocispec.Manifest
	switch target.MediaType {
	case ocispec.MediaTypeImageIndex, "application/vnd.docker.distribution.manifest.list.v2+json":
		var idx ocispec.Index
		if err := c.readJSON(ctx, target.Digest, &idx); err != nil {
			return mf, fmt.Errorf("ctrsnap: the image's index: %w", err)
		}
		for _, m := range idx.Manifests {
			if m.Platform != nil && m.Platform.OS == "linux" && m.Platform.Architecture == runtime.GOARCH {
				return mf, c.readJSON(ctx, m.Digest.String(), &mf)
			}
		}
		return mf, fmt.Errorf("ctrsnap: the image's index has no linux/%s manifest", runtime.GOARCH)
	default:
		if err := c.readJSON(ctx, target.Digest, &mf); err != nil {
			return mf, fmt.Errorf("ctrsnap: the image's manifest: %w", err)
		}
		return mf, nil
	}
}

// containerEnv is the environment of the container's OCI runtime spec (JSON), less
// HOSTNAME (the pod's) and drop.
func containerEnv(spec []byte, drop []string) ([]string, error) {
	var s struct {
		Process struct {
			Env []string `json:"env"`
		} `json:"process"`
	}
	if err := json.Unmarshal(spec, &s); err != nil {
		return nil, fmt.Errorf("ctrsnap: the container's spec: %w", err)
	}
	out := make([]string, 0, len(s.Process.Env))
	for _, kv := range s.Process.Env {
		k, _, _ := strings.Cut(kv, "=")
		if k == "HOSTNAME" || containsString(drop, k) {
			continue
		}
		out = append(out, kv)
	}
	return out, nil
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// chainID is the OCI chain id of diffIDs (the snapshot name of their top layer).
func chainID(diffIDs []ocispecDigest) string {
	if len(diffIDs) == 0 {
		return ""
	}
	id := diffIDs[0].String()
	for _, d := range diffIDs[1:] {
		sum := sha256.Sum256([]byte(id + " " + d.String()))
		id = "sha256:" + hex.EncodeToString(sum[:])
	}
	return id
}
