package sandboximage

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"github.com/moby/moby/client"
)

// ExecdRepository is the image the Kubernetes runtime's init container runs
// (lifecycle/kube Config.ExecdImage): the static execd at /execd, nothing else but
// /tmp and a passwd naming its user.
const ExecdRepository = "airlock/execd"

// ExecdUser is the image's user (uid:gid); the init container only writes into the
// pod's emptyDir, which any user may.
const ExecdUser = "65532:65532"

// BuildExecd makes repo:<version> and repo:latest (repo defaults to ExecdRepository)
// from the static execd binary at execdPath, with docker import: no base image, no
// registry, no root needed. Skipped when both tags already carry the binary's hash
// (label RecipeLabel) unless force. The binary must be a static Linux ELF executable.
func (b *Builder) BuildExecd(ctx context.Context, repo, execdPath, version string, force bool) (Result, error) {
	if repo == "" {
		repo = ExecdRepository
	}
	bin, err := os.ReadFile(execdPath)
	if err != nil {
		return Result{}, fmt.Errorf("sandboximage: the execd binary (make build writes bin/execd): %w", err)
	}
	if err := checkStatic(bin); err != nil {
		return Result{}, fmt.Errorf("sandboximage: %s: %w", execdPath, err)
	}
	sum := sha256.Sum256(bin)
	hash := "execd-" + hex.EncodeToString(sum[:])[:24]
	refs := []string{repo + ":" + version, repo + ":latest"}
	if !force {
		if id, ok := b.cached(ctx, refs, hash); ok {
			return Result{Refs: refs, Cached: true, ImageID: id}, nil
		}
	}
	root, err := execdRoot(bin)
	if err != nil {
		return Result{}, err
	}
	resp, err := b.Docker.ImageImport(ctx, client.ImageImportSource{Source: bytes.NewReader(root), SourceName: "-"}, refs[0],
		client.ImageImportOptions{Message: "airlock image build execd", Changes: []string{
			`ENTRYPOINT ["/execd"]`, "USER " + ExecdUser, "WORKDIR /tmp",
			fmt.Sprintf("LABEL %s=%s", RecipeLabel, hash),
		}})
	if err != nil {
		return Result{}, fmt.Errorf("docker import: %w", err)
	}
	id, err := readImportResult(resp)
	resp.Close()
	if err != nil {
		return Result{}, fmt.Errorf("docker import: %w", err)
	}
	for _, ref := range refs[1:] {
		if _, err := b.Docker.ImageTag(ctx, client.ImageTagOptions{Source: refs[0], Target: ref}); err != nil {
			return Result{}, fmt.Errorf("docker tag %s: %w", ref, err)
		}
	}
	b.say("built %s", refs[0])
	return Result{Refs: refs, ImageID: id}, nil
}

// checkStatic refuses what cannot run alone in an empty image: not a Linux ELF
// executable, or one that needs a dynamic loader.
func checkStatic(bin []byte) error {
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("not an ELF executable: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("dynamically linked; build it with CGO_ENABLED=0")
		}
	}
	return nil
}

// execdRoot is the image's file system as a tar: /execd, /tmp and /etc/passwd, group.
func execdRoot(bin []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	dirs := []struct {
		name string
		mode int64
	}{{"etc/", 0o755}, {"tmp/", 0o1777}}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d.name, Mode: d.mode, ModTime: now}); err != nil {
			return nil, err
		}
	}
	files := []struct {
		name string
		mode int64
		data []byte
	}{
		{"execd", 0o755, bin},
		{"etc/passwd", 0o644, []byte("root:x:0:0:root:/:/execd\nnonroot:x:65532:65532:nonroot:/tmp:/execd\n")},
		{"etc/group", 0o644, []byte("root:x:0:\nnonroot:x:65532:\n")},
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.data)), ModTime: now}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
