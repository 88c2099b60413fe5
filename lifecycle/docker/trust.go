package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// Where a sandbox that must trust extra CAs (lifecycle.Spec.TrustedCAPEM: the
// credential proxy's interception CA) finds them.
const (
	// SystemBundle is Debian's system trust store; the CAs are appended to the image's.
	SystemBundle = "/etc/ssl/certs/ca-certificates.crt"
	// ExtraCAPath holds the extra CAs alone (NODE_EXTRA_CA_CERTS adds them to Node's).
	ExtraCAPath = "/usr/local/share/ca-certificates/airlock-credential-proxy.crt"
)

// trustEnv points OpenSSL, Python requests, Node and git at the trust store with the
// extra CAs; it overrides the create request's values of these names. (Debian's git
// uses libcurl-gnutls, which reads the system store too; GIT_SSL_CAINFO says so
// explicitly, as on Kubernetes, where the bundle is elsewhere.)
func trustEnv() map[string]string {
	return map[string]string{
		"SSL_CERT_FILE":       SystemBundle,
		"GIT_SSL_CAINFO":      SystemBundle,
		"REQUESTS_CA_BUNDLE":  SystemBundle,
		"NODE_EXTRA_CA_CERTS": ExtraCAPath,
	}
}

// installTrust writes the image's system bundle plus ca to SystemBundle and ca alone to
// ExtraCAPath in the created (not yet started) container id of image imageID (the base
// image's id: the execd template above it does not touch the bundle; empty when the
// container has mounts, which may cover the bundle: it is then read, never cached). An
// image without a bundle gets one holding ca only.
func (r *Runtime) installTrust(ctx context.Context, imageID, id string, ca []byte) error {
	bundle, err := r.bundles.get(ctx, imageID, func() ([]byte, error) { return r.readBundle(ctx, id) })
	if err != nil {
		return err
	}
	full := make([]byte, 0, len(bundle)+1+len(ca)) // bundle is shared: never append to it
	full = append(full, bundle...)
	if len(full) > 0 && !bytes.HasSuffix(full, []byte("\n")) {
		full = append(full, '\n')
	}
	dirs := []string{"etc/", "etc/ssl/", "etc/ssl/certs/", "usr/", "usr/local/", "usr/local/share/", "usr/local/share/ca-certificates/"}
	if err := r.writeTrustStore(ctx, id, dirs, append(full, ca...), ca); err != nil {
		return fmt.Errorf("docker: installing the credential proxy CA: %w", err)
	}
	return nil
}

// readBundle returns SystemBundle as it is in container id (nil when it has none).
func (r *Runtime) readBundle(ctx context.Context, id string) ([]byte, error) {
	res, err := r.cli.CopyFromContainer(ctx, id, client.CopyFromContainerOptions{SourcePath: SystemBundle})
	switch {
	case err == nil:
		bundle, err := firstFile(res.Content)
		res.Content.Close()
		if err != nil {
			return nil, fmt.Errorf("docker: reading the image's %s: %w", SystemBundle, err)
		}
		return bundle, nil
	case !cerrdefs.IsNotFound(err):
		return nil, fmt.Errorf("docker: reading the image's %s: %w", SystemBundle, err)
	}
	return nil, nil
}

// maxBundles bounds bundleCache: past it, the cache starts over.
const maxBundles = 64

// bundleCache holds each image's own SystemBundle, read from the first container of
// that image that needs the extra CAs: an image id names immutable content, so every
// later sandbox of the image (the ten of a fork) skips a copy out of its container,
// which costs the engine a rootfs mount (about 65 ms of CPU each on the 2-core test
// host). Concurrent first reads of one image wait for a single read; a failed read is
// not kept.
type bundleCache struct {
	mu      sync.Mutex
	byImage map[string]*bundleRead
	reads   int // reads from a container, for the tests
}

type bundleRead struct {
	done   chan struct{}
	bundle []byte
	err    error
}

// get returns image imageID's bundle, calling read when it is not known yet (read's
// result is shared with every caller waiting meanwhile). The caller must not modify
// the slice. An empty imageID is never cached.
func (c *bundleCache) get(ctx context.Context, imageID string, read func() ([]byte, error)) ([]byte, error) {
	c.mu.Lock()
	if imageID == "" {
		c.reads++
		c.mu.Unlock()
		return read()
	}
	if c.byImage == nil || len(c.byImage) >= maxBundles {
		c.byImage = map[string]*bundleRead{}
	}
	b, ok := c.byImage[imageID]
	if !ok {
		b = &bundleRead{done: make(chan struct{})}
		c.byImage[imageID] = b
		c.reads++
	}
	c.mu.Unlock()
	if ok {
		select {
		case <-b.done:
			return b.bundle, b.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	b.bundle, b.err = read()
	if b.err != nil {
		c.mu.Lock()
		if c.byImage[imageID] == b {
			delete(c.byImage, imageID)
		}
		c.mu.Unlock()
	}
	close(b.done)
	return b.bundle, b.err
}

// writeTrustStore writes bundle to SystemBundle and ca to ExtraCAPath (mode 0644) in
// container id, after creating dirs (tar names, "etc/ssl/", mode 0755) when given.
func (r *Runtime) writeTrustStore(ctx context.Context, id string, dirs []string, bundle, ca []byte) error {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: now}); err != nil {
			return err
		}
	}
	for name, content := range map[string][]byte{SystemBundle[1:]: bundle, ExtraCAPath[1:]: ca} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(content)), ModTime: now}); err != nil {
			return err
		}
		if _, err := tw.Write(content); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	_, err := r.cli.CopyToContainer(ctx, id, client.CopyToContainerOptions{DestinationPath: "/", Content: &buf})
	return err
}

// firstFile returns the content of the first regular file in a tar stream.
func firstFile(r io.Reader) ([]byte, error) {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err != nil {
			if err == io.EOF {
				return nil, nil
			}
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			return io.ReadAll(io.LimitReader(tr, 16<<20))
		}
	}
}
