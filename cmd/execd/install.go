package main

import (
	"bytes"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// installSelf copies the running executable to dst (mode 0755), through a temporary
// file renamed into place.
func installSelf(dst string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	bin, err := os.ReadFile(self)
	if err != nil {
		return fmt.Errorf("install: reading %s: %w", self, err)
	}
	if err := writeFile(dst, bin, 0o755); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	return nil
}

// Files --install-trust writes into its folder (lifecycle/kube's TrustBundlePath and
// TrustExtraPath), and the system bundle it starts from (Debian's path, which the
// Docker runtime appends to).
const (
	trustBundleName = "ca-certificates.crt"
	trustExtraName  = "airlock-credential-proxy.crt"
	systemBundle    = "/etc/ssl/certs/ca-certificates.crt"
)

// installTrust writes dir/ca-certificates.crt (the system bundle at sys, when there is
// one, followed by ca) and dir/airlock-credential-proxy.crt (ca alone). ca must hold
// at least one PEM CERTIFICATE block and nothing but certificates.
func installTrust(dir, sys string, ca []byte) error {
	if err := checkCerts(ca); err != nil {
		return fmt.Errorf("install-trust: %w", err)
	}
	bundle, err := os.ReadFile(sys)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("install-trust: reading %s: %w", sys, err)
	}
	if len(bundle) > 0 && !bytes.HasSuffix(bundle, []byte("\n")) {
		bundle = append(bundle, '\n')
	}
	if err := writeFile(filepath.Join(dir, trustExtraName), ca, 0o644); err != nil {
		return fmt.Errorf("install-trust: %w", err)
	}
	if err := writeFile(filepath.Join(dir, trustBundleName), append(bundle, ca...), 0o644); err != nil {
		return fmt.Errorf("install-trust: %w", err)
	}
	return nil
}

// checkCerts accepts PEM holding one or more CERTIFICATE blocks and nothing else (a
// private key by mistake is refused).
func checkCerts(b []byte) error {
	n := 0
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			if len(bytes.TrimSpace(rest)) > 0 {
				return errors.New("the CA is not PEM")
			}
			break
		}
		if blk.Type != "CERTIFICATE" {
			return fmt.Errorf("the CA holds a %s block; want certificates only", blk.Type)
		}
		n++
	}
	if n == 0 {
		return errors.New("the CA holds no certificate")
	}
	return nil
}

// writeFile writes b to dst with mode through a temporary file renamed into place.
func writeFile(dst string, b []byte, mode os.FileMode) error {
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
