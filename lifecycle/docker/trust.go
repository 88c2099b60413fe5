package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
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
// ExtraCAPath in the created (not yet started) container. An image without a bundle
// gets one holding ca only.
func (r *Runtime) installTrust(ctx context.Context, id string, ca []byte) error {
	var bundle []byte
	res, err := r.cli.CopyFromContainer(ctx, id, client.CopyFromContainerOptions{SourcePath: SystemBundle})
	switch {
	case err == nil:
		bundle, err = firstFile(res.Content)
		res.Content.Close()
		if err != nil {
			return fmt.Errorf("docker: reading the image's %s: %w", SystemBundle, err)
		}
	case !cerrdefs.IsNotFound(err):
		return fmt.Errorf("docker: reading the image's %s: %w", SystemBundle, err)
	}
	if len(bundle) > 0 && !bytes.HasSuffix(bundle, []byte("\n")) {
		bundle = append(bundle, '\n')
	}
	dirs := []string{"etc/", "etc/ssl/", "etc/ssl/certs/", "usr/", "usr/local/", "usr/local/share/", "usr/local/share/ca-certificates/"}
	if err := r.writeTrustStore(ctx, id, dirs, append(bundle, ca...), ca); err != nil {
		return fmt.Errorf("docker: installing the credential proxy CA: %w", err)
	}
	return nil
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
