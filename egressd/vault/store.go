// Package vault is the Credential Vault (OpenSandbox OSEP-0012, egress-api.yaml
// /credential-vault): per sandbox, named credentials and bindings that say which
// outbound requests get which credential, plus the sandbox's interception CA. egressd's
// L7 proxy asks Intercepts per connection and Match per request; lifecycle serves the
// API through ServeAPI. Values are sealed at rest (AES-256-GCM with a node key) and
// leave the store only inside Injection, for the upstream request.
package vault

import (
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
)

// Request is one outbound HTTP request as the proxy sees it.
type Request struct {
	Scheme string // "http" or "https"
	Host   string // lower-case FQDN, no port
	Port   uint16
	Method string
	Path   string
}

// Header is one header to set on the upstream request; Value is in clear.
type Header struct{ Name, Value string }

// Injection is what to do to a matching request: set Headers (replacing the sandbox's
// own headers of the same names).
type Injection struct {
	Binding string
	Headers []Header
}

// Change describes an applied vault change, for the audit log: names only, never values.
type Change struct {
	SandboxID, Op string // Op: create, patch, delete
	Revision      int64
	Credentials   []string
	Bindings      []string
}

// sealed is what one sandbox's file holds, before sealing.
type sealed struct {
	CACert []byte `json:"caCert"` // DER
	CAKey  []byte `json:"caKey"`  // PKCS #8 DER
	Vault  *vault `json:"vault,omitempty"`
}

// vault is one sandbox's credentials and bindings (values included).
type vault struct {
	Revision    int64        `json:"revision"`
	Credentials []storedCred `json:"credentials"`
	Bindings    []storedBind `json:"bindings"`
}

type storedCred struct {
	Name     string `json:"name"`
	Value    string `json:"value"`
	Revision int64  `json:"revision"`
}

type storedBind struct {
	Binding  Binding `json:"binding"` // Match normalized
	Revision int64   `json:"revision"`
}

// entry is one sandbox in memory. Entries are immutable once published.
type entry struct {
	data   sealed
	cert   *x509.Certificate
	key    crypto.Signer
	certPM []byte
}

// Store holds every sandbox's vault. Reads (Intercepts, Match, CA of an existing
// sandbox) take no lock; changes are serialised, persisted, then published.
type Store struct {
	dir      string
	aead     cipher.AEAD
	log      *slog.Logger
	mu       sync.Mutex // writers
	snap     atomic.Pointer[map[string]*entry]
	onChange atomic.Pointer[func(Change)]
}

// Open opens (creating) the store in dir (mode 0700): the node key dir/node.key (32
// random bytes, 0600, created once) and every sealed dir/<sandbox>.vault. A file that
// does not open with the key is an error naming it.
func Open(dir string, log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("vault: %w", err)
	}
	key, err := nodeKey(filepath.Join(dir, "node.key"))
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	s := &Store{dir: dir, aead: aead, log: log}
	m := map[string]*entry{}
	files, err := filepath.Glob(filepath.Join(dir, "*.vault"))
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		id := strings.TrimSuffix(filepath.Base(f), ".vault")
		e, err := s.load(f, id)
		if err != nil {
			return nil, fmt.Errorf("vault: %s: %w", f, err)
		}
		m[id] = e
	}
	s.snap.Store(&m)
	return s, nil
}

// Close releases nothing today; it exists for symmetry with the other components.
func (s *Store) Close() error { return nil }

// OnChange sets the hook called after every applied change (for the audit log).
func (s *Store) OnChange(fn func(Change)) { s.onChange.Store(&fn) }

func nodeKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if len(b) != 32 {
			return nil, fmt.Errorf("vault: node key %s is %d bytes, want 32", path, len(b))
		}
		return b, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("vault: node key: %w", err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := writeFile(path, key); err != nil {
		return nil, fmt.Errorf("vault: writing the node key: %w", err)
	}
	return key, nil
}

func (s *Store) load(path, id string) (*entry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	ns := s.aead.NonceSize()
	if len(b) < ns {
		return nil, errors.New("truncated")
	}
	plain, err := s.aead.Open(nil, b[:ns], b[ns:], []byte(id))
	if err != nil {
		return nil, errors.New("does not open with the node key (tampered, or another node's file)")
	}
	var d sealed
	if err := json.Unmarshal(plain, &d); err != nil {
		return nil, err
	}
	return newEntry(d)
}

func newEntry(d sealed) (*entry, error) {
	cert, err := x509.ParseCertificate(d.CACert)
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(d.CAKey)
	if err != nil {
		return nil, err
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("CA key is not a signer")
	}
	return &entry{data: d, cert: cert, key: signer,
		certPM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: d.CACert})}, nil
}

// persist seals d into the sandbox's file (fsync'd, atomic rename).
func (s *Store) persist(id string, d sealed) error {
	plain, err := json.Marshal(d)
	if err != nil {
		return err
	}
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return err
	}
	return writeFile(filepath.Join(s.dir, id+".vault"), s.aead.Seal(nonce, nonce, plain, []byte(id)))
}

func writeFile(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (s *Store) get(id string) *entry { return (*s.snap.Load())[id] }

// publish replaces (or with e nil removes) the sandbox's entry; s.mu is held.
func (s *Store) publish(id string, e *entry) {
	old := *s.snap.Load()
	m := make(map[string]*entry, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	if e == nil {
		delete(m, id)
	} else {
		m[id] = e
	}
	s.snap.Store(&m)
}

// CA returns the sandbox's interception CA, creating it on first use (ECDSA P-256,
// valid 10 years from an hour ago, sealed with the vault). certPEM goes into the
// sandbox's trust store; the key never leaves egressd.
func (s *Store) CA(sandboxID string) (*x509.Certificate, crypto.Signer, []byte, error) {
	if e := s.get(sandboxID); e != nil {
		return e.cert, e.key, e.certPM, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.get(sandboxID); e != nil {
		return e.cert, e.key, e.certPM, nil
	}
	der, pkcs8, err := NewCA(sandboxID)
	if err != nil {
		return nil, nil, nil, err
	}
	e, err := newEntry(sealed{CACert: der, CAKey: pkcs8})
	if err != nil {
		return nil, nil, nil, err
	}
	if err := s.persist(sandboxID, e.data); err != nil {
		return nil, nil, nil, fmt.Errorf("vault: sealing the CA of %s: %w", sandboxID, err)
	}
	s.publish(sandboxID, e)
	return e.cert, e.key, e.certPM, nil
}

// Delete removes the sandbox's vault and CA, in memory and on disk. Idempotent.
func (s *Store) Delete(sandboxID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.publish(sandboxID, nil)
	if err := os.Remove(filepath.Join(s.dir, sandboxID+".vault")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Intercepts reports whether a binding of the sandbox matches scheme, host and port:
// the proxy intercepts (MITM) only then. No I/O.
func (s *Store) Intercepts(sandboxID, scheme, host string, port uint16) bool {
	e := s.get(sandboxID)
	if e == nil || e.data.Vault == nil {
		return false
	}
	for _, b := range e.data.Vault.Bindings {
		if b.matchesConn(scheme, host, port) {
			return true
		}
	}
	return false
}

// Match returns the injection of the first binding (in order) matching all of q's
// scheme, port, host, method and path. The method is compared exactly (methods are
// case-sensitive, RFC 9110 §9.1, and the upstream gets the request's own); q.Path must
// be the decoded form of a path httppath.Canonical accepted. No I/O.
func (s *Store) Match(sandboxID string, q Request) (Injection, bool) {
	e := s.get(sandboxID)
	if e == nil || e.data.Vault == nil {
		return Injection{}, false
	}
	v := e.data.Vault
	for _, b := range v.Bindings {
		m := b.Binding.Match
		if !b.matchesConn(q.Scheme, q.Host, q.Port) || !contains(m.Methods, q.Method) {
			continue
		}
		pathOK := false
		for _, p := range m.Paths {
			if pathMatches(p, q.Path) {
				pathOK = true
				break
			}
		}
		if !pathOK {
			continue
		}
		return Injection{Binding: b.Binding.Name, Headers: v.headers(b.Binding.Auth)}, true
	}
	return Injection{}, false
}

func (b storedBind) matchesConn(scheme, host string, port uint16) bool {
	m := b.Binding.Match
	if !contains(m.Schemes, scheme) {
		return false
	}
	portOK := false
	for _, p := range m.Ports {
		if p == int(port) {
			portOK = true
			break
		}
	}
	if !portOK {
		return false
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	for _, h := range m.Hosts {
		if hostMatches(h, host) {
			return true
		}
	}
	return false
}

// headers builds the injected headers of auth from the stored values.
func (v *vault) headers(a Auth) []Header {
	val := func(name string) string {
		for _, c := range v.Credentials {
			if c.Name == name {
				return c.Value
			}
		}
		return ""
	}
	switch a.Type {
	case "bearer":
		return []Header{{"Authorization", "Bearer " + val(a.Credential)}}
	case "basic":
		return []Header{{"Authorization", "Basic " + val(a.Credential)}}
	case "apiKey":
		return []Header{{a.Name, val(a.Credential)}}
	default: // customHeaders
		out := make([]Header, 0, len(a.Headers))
		for _, h := range a.Headers {
			out = append(out, Header{h.Name, val(h.Credential)})
		}
		return out
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// CopyVault gives holder to a copy of holder from's credentials and bindings (values
// included), sealed under this node's key like every vault file; to keeps (or gets) its
// own interception CA, never from's. Lifecycle uses it for snapshots: the source
// sandbox's vault is copied to the snapshot's id at capture and from there to each
// sandbox restored from it, so secrets are re-bound without ever leaving egressd. A
// from without a vault (or without credentials and bindings) copies nothing; to's
// previous vault is replaced.
func (s *Store) CopyVault(from, to string) error {
	src := s.get(from)
	if src == nil || src.data.Vault == nil {
		return nil
	}
	if _, _, _, err := s.CA(to); err != nil {
		return err
	}
	cp := *src.data.Vault
	cp.Credentials = append([]storedCred(nil), src.data.Vault.Credentials...)
	cp.Bindings = append([]storedBind(nil), src.data.Vault.Bindings...)
	_, err := s.change(to, "copy", func(*vault) (*vault, error) { return &cp, nil })
	return err
}
