package principal

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Sentinel errors of the Keyring (lifecycle maps them to HTTP status).
var (
	// ErrNotFound: no key has that id.
	ErrNotFound = errors.New("no such API key")
	// ErrInvalid: a name or role that cannot be used.
	ErrInvalid = errors.New("invalid API key request")
	// ErrConfigured: the configured API key is not managed through the API (change it
	// where it is configured).
	ErrConfigured = errors.New("the configured API key is managed in the server's configuration")
)

// Store persists the keys: one JSON document (a Stored) per principal id. lifecycle's
// boltstore and kubestore implement it. Every write is durable when it returns.
type Store interface {
	// Keys returns every document by principal id.
	Keys() (map[string][]byte, error)
	// PutKey writes the document of id, replacing any previous one.
	PutKey(id string, doc []byte) error
	// DeleteKey removes it; a missing one is not an error.
	DeleteKey(id string) error
}

// Stored is what a Store keeps of one principal: never the key, only its SHA-256.
type Stored struct {
	Principal
	// SHA256 is the hex SHA-256 of the key (64 digits).
	SHA256    string    `json:"sha256"`
	CreatedAt time.Time `json:"createdAt"`
	// RotatedAt is when the key was last replaced; zero if never.
	RotatedAt time.Time `json:"rotatedAt,omitzero"`
}

// Info is the API's view of a principal and its key (GET /v1/keys): no secret.
type Info struct {
	Principal
	CreatedAt time.Time `json:"createdAt,omitzero"`
	RotatedAt time.Time `json:"rotatedAt,omitzero"`
	// Configured is set for the key of the server's configuration (the first admin):
	// it cannot be revoked or rotated through the API.
	Configured bool `json:"configured,omitempty"`
}

// Created is the answer to a key creation or rotation: the principal and, once, its
// key (Key, "ak_" + 43 base64url characters = 256 random bits).
type Created struct {
	Info
	Key string `json:"key"`
}

// CreateRequest is the body of POST /v1/keys: a name (1–100 characters, free text)
// and a role.
type CreateRequest struct {
	Name string `json:"name"`
	Role Role   `json:"role"`
}

// Keyring authenticates API keys and manages them. It keeps every key's hash in
// memory (Authenticate performs no I/O) and writes through to its Store; Follow
// re-reads the store so that changes made by other servers sharing it (lifecycle
// replicas) take effect here within one interval. Methods are safe for concurrent use.
type Keyring struct {
	store      Store
	configured [32]byte // SHA-256 of the configured key; zero when none
	hasConfig  bool
	log        *slog.Logger

	mu     sync.RWMutex
	byHash map[[32]byte]Stored
	byID   map[string]Stored
	gen    uint64 // bumped by every local change, so a slower reload never undoes one
}

// NewKeyring loads the keys of store (nil: keys live in memory only and are lost at
// restart) and admits configuredKey (empty: none) as the admin principal
// ConfiguredAdminID.
func NewKeyring(store Store, configuredKey string, log *slog.Logger) (*Keyring, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if store == nil {
		store = &memStore{m: map[string][]byte{}}
	}
	k := &Keyring{store: store, log: log, byHash: map[[32]byte]Stored{}, byID: map[string]Stored{}}
	if configuredKey != "" {
		k.configured, k.hasConfig = sha256.Sum256([]byte(configuredKey)), true
	}
	if err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// configuredPrincipal is the principal of the configured key.
var configuredPrincipal = Principal{ID: ConfiguredAdminID, Name: "admin (configured key)", Role: Admin}

// Authenticate returns the principal whose key is key. It performs no I/O; the
// comparison with the configured key is constant-time, and stored keys are found by
// their SHA-256 (a 256-bit random key's hash reveals nothing usable about it).
func (k *Keyring) Authenticate(key string) (Principal, bool) {
	if key == "" {
		return Principal{}, false
	}
	sum := sha256.Sum256([]byte(key))
	if k.hasConfig && subtle.ConstantTimeCompare(sum[:], k.configured[:]) == 1 {
		return configuredPrincipal, true
	}
	k.mu.RLock()
	st, ok := k.byHash[sum]
	k.mu.RUnlock()
	if !ok {
		return Principal{}, false
	}
	return st.Principal, true
}

// HasKeys reports whether any key can authenticate (the configured one or a stored one).
func (k *Keyring) HasKeys() bool {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.hasConfig || len(k.byID) > 0
}

// List returns every principal, the configured admin first, then by creation time.
func (k *Keyring) List() []Info {
	k.mu.RLock()
	out := make([]Info, 0, len(k.byID)+1)
	for _, st := range k.byID {
		out = append(out, st.info())
	}
	k.mu.RUnlock()
	slices.SortFunc(out, func(a, b Info) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	if k.hasConfig {
		out = slices.Insert(out, 0, Info{Principal: configuredPrincipal, Configured: true})
	}
	return out
}

func (st Stored) info() Info {
	return Info{Principal: st.Principal, CreatedAt: st.CreatedAt, RotatedAt: st.RotatedAt}
}

// Create makes a principal with a new key; the key is in the answer and nowhere else.
// Errors: ErrInvalid (name empty, over 100 characters or not UTF-8; unknown role), or
// the store's.
func (k *Keyring) Create(req CreateRequest) (Created, error) {
	name := strings.TrimSpace(req.Name)
	if name == "" || len(name) > 100 || !utf8.ValidString(name) {
		return Created{}, fmt.Errorf("%w: name must be 1 to 100 characters", ErrInvalid)
	}
	if !req.Role.Valid() {
		return Created{}, fmt.Errorf("%w: role %q: want admin, operator, auditor or user", ErrInvalid, req.Role)
	}
	key := NewKey()
	st := Stored{
		Principal: Principal{ID: newID(), Name: name, Role: req.Role},
		SHA256:    Hash(key), CreatedAt: time.Now().UTC(),
	}
	if err := k.put(st, ""); err != nil {
		return Created{}, err
	}
	k.log.Info("api key created", "principal_id", st.ID, "role", string(st.Role))
	return Created{Info: st.info(), Key: key}, nil
}

// Revoke deletes principal id's key: from the moment Revoke returns, this Keyring no
// longer admits it (others sharing the store: within their Follow interval). Errors:
// ErrConfigured, ErrNotFound, the store's.
func (k *Keyring) Revoke(id string) error {
	if id == ConfiguredAdminID {
		return ErrConfigured
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	st, ok := k.byID[id]
	if !ok {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if err := k.store.DeleteKey(id); err != nil {
		return fmt.Errorf("api keys: %w", err)
	}
	delete(k.byID, id)
	delete(k.byHash, st.hash())
	k.gen++
	k.log.Info("api key revoked", "principal_id", id)
	return nil
}

// Rotate gives principal id a new key (in the answer only); the old one stops working
// when Rotate returns. Errors as Revoke.
func (k *Keyring) Rotate(id string) (Created, error) {
	if id == ConfiguredAdminID {
		return Created{}, ErrConfigured
	}
	k.mu.RLock()
	st, ok := k.byID[id]
	k.mu.RUnlock()
	if !ok {
		return Created{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	old := st.SHA256
	key := NewKey()
	st.SHA256, st.RotatedAt = Hash(key), time.Now().UTC()
	if err := k.put(st, old); err != nil {
		return Created{}, err
	}
	k.log.Info("api key rotated", "principal_id", id)
	return Created{Info: st.info(), Key: key}, nil
}

// put writes st to the store and the maps; replaced is the hash it had ("" for new).
func (k *Keyring) put(st Stored, replaced string) error {
	doc, err := json.Marshal(st)
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if replaced != "" {
		cur, ok := k.byID[st.ID]
		if !ok || cur.SHA256 != replaced {
			return fmt.Errorf("%w: %q changed meanwhile", ErrNotFound, st.ID)
		}
	}
	if err := k.store.PutKey(st.ID, doc); err != nil {
		return fmt.Errorf("api keys: %w", err)
	}
	if cur, ok := k.byID[st.ID]; ok {
		delete(k.byHash, cur.hash())
	}
	k.byID[st.ID] = st
	k.byHash[st.hash()] = st
	k.gen++
	return nil
}

func (st Stored) hash() [32]byte {
	var h [32]byte
	_, _ = hex.Decode(h[:], []byte(st.SHA256))
	return h
}

// Reload replaces the keys in memory with the store's. A document that does not decode
// is logged and skipped (it admits nobody).
func (k *Keyring) Reload() error {
	k.mu.RLock()
	gen := k.gen
	k.mu.RUnlock()
	docs, err := k.store.Keys()
	if err != nil {
		return fmt.Errorf("api keys: %w", err)
	}
	byID := make(map[string]Stored, len(docs))
	byHash := make(map[[32]byte]Stored, len(docs))
	for id, doc := range docs {
		var st Stored
		if err := json.Unmarshal(doc, &st); err != nil || st.ID != id || len(st.SHA256) != 64 || !st.Role.Valid() {
			k.log.Error("ignoring an unreadable api key document", "principal_id", id, "err", err)
			continue
		}
		byID[id], byHash[st.hash()] = st, st
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.gen != gen {
		return nil // a local change came in between; the next reload sees it
	}
	k.byID, k.byHash = byID, byHash
	return nil
}

// Follow reloads every interval until ctx ends (servers sharing the store: a key
// revoked elsewhere stops working here within interval plus the store's read time).
// Errors are logged; the keys in memory stay as they were.
func (k *Keyring) Follow(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := k.Reload(); err != nil {
				k.log.Warn("reloading api keys failed", "err", err)
			}
		}
	}
}

// NewKey returns a new API key: "ak_" and 32 random bytes in base64url (43 characters).
func NewKey() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("principal: no randomness: " + err.Error()) // crypto/rand does not fail on Linux
	}
	return "ak_" + base64.RawURLEncoding.EncodeToString(b[:])
}

// Hash is the hex SHA-256 of key, as Stored keeps it.
func Hash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// newID returns a principal id: "p_" and 16 hex digits.
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "p_" + hex.EncodeToString(b[:])
}

// memStore is the Store of a Keyring without one.
type memStore struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *memStore) Keys() (map[string][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]byte, len(s.m))
	for k, v := range s.m {
		out[k] = v
	}
	return out, nil
}

func (s *memStore) PutKey(id string, doc []byte) error {
	s.mu.Lock()
	s.m[id] = doc
	s.mu.Unlock()
	return nil
}

func (s *memStore) DeleteKey(id string) error {
	s.mu.Lock()
	delete(s.m, id)
	s.mu.Unlock()
	return nil
}
