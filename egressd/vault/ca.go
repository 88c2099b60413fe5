package vault

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// NewCA makes a sandbox's interception CA: an ECDSA P-256 key and a self-signed CA
// certificate for it (CommonName "Airlock credential proxy CA <sandboxID>", valid 10
// years from an hour ago, path length 0). It returns the certificate's DER and the key
// in PKCS #8 DER. Store.CA makes one on a sandbox's first use; on Kubernetes lifecycle
// makes it at create (the pod's trust init container needs the certificate before the
// pod has a node) and hands it to the node's egressd (Store.ImportCA).
func NewCA(sandboxID string) (certDER, keyPKCS8 []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "Airlock credential proxy CA " + sandboxID, Organization: []string{"Airlock"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	if certDER, err = x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key); err != nil {
		return nil, nil, err
	}
	if keyPKCS8, err = x509.MarshalPKCS8PrivateKey(key); err != nil {
		return nil, nil, err
	}
	return certDER, keyPKCS8, nil
}

// ImportCA makes certDER (a CA certificate) with keyPKCS8 (its key, PKCS #8) the
// sandbox's interception CA, sealed like one CA makes; the sandbox's credentials and
// bindings, if any, stay. Importing the CA the sandbox has is a no-op. Errors: the
// certificate is not a CA, or the key is not its key.
func (s *Store) ImportCA(sandboxID string, certDER, keyPKCS8 []byte) error {
	e, err := newEntry(sealed{CACert: certDER, CAKey: keyPKCS8})
	if err != nil {
		return fmt.Errorf("vault: the CA of %s: %w", sandboxID, err)
	}
	if !e.cert.IsCA {
		return fmt.Errorf("vault: the CA of %s: not a CA certificate", sandboxID)
	}
	pub, ok := e.key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(e.cert.PublicKey) {
		return errors.New("vault: the CA key does not match its certificate")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur := s.get(sandboxID); cur != nil {
		if cur.cert.Equal(e.cert) {
			return nil
		}
		e.data.Vault = cur.data.Vault
	}
	if err := s.persist(sandboxID, e.data); err != nil {
		return fmt.Errorf("vault: sealing the CA of %s: %w", sandboxID, err)
	}
	s.publish(sandboxID, e)
	return nil
}
