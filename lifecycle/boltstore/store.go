// Package boltstore keeps lifecycle's state in an embedded bbolt database on one host
// (airlock up: <stateDir>/lifecycle.db): one JSON document per sandbox, the instance id
// that marks this server's containers, and the applied version of each named policy.
// It is the single-host lifecycle.StateStore; lifecycle/kubestore is the cluster's.
//
// The file holds five buckets: "sandboxes" (sandbox id → the document lifecycle
// wrote), "meta" (key "instance" → the instance id), "policy-library" (policy name
// → library.Stored as JSON), "snapshots" (snapshot id → the document lifecycle
// wrote) and "keys" (principal id → principal.Stored as JSON: the API key's SHA-256,
// never the key). Every write is fsync'd before it returns.
package boltstore

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/policies/library"
	"github.com/airlockdev/airlock/principal"
)

// The database's buckets and keys (the on-disk format; see the package doc).
var (
	bucketSandboxes = []byte("sandboxes")
	bucketMeta      = []byte("meta")
	bucketLibrary   = []byte("policy-library")
	bucketSnapshots = []byte("snapshots")
	bucketKeys      = []byte("keys")
	keyInstance     = []byte("instance")
)

// Store is lifecycle's embedded database (bbolt): one JSON document per sandbox for
// what container labels cannot hold (mutable metadata, expiry, policy, status
// history), the instance id that marks this server's containers, and the policy
// library's applied versions. Methods are safe for concurrent use.
type Store struct {
	db *bolt.DB
}

// Open opens (creating when missing) the database file at path; its directory is
// created with mode 0700 and the file with 0600. It fails when another process holds
// the file (bbolt's lock) after 5 s.
func Open(path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketSandboxes, bucketMeta, bucketLibrary, bucketSnapshots, bucketKeys} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("store: init %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close closes the database; safe on nil.
func (s *Store) Close() error {
	if s == nil || s.db == nil {
		return nil
	}
	return s.db.Close()
}

// InstanceID returns this store's instance id (12 hex digits), creating it on first
// use. Containers carry it in a label, so that one server adopts and cleans up only
// its own.
func (s *Store) InstanceID() (string, error) {
	var id string
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMeta)
		if v := b.Get(keyInstance); v != nil {
			id = string(v)
			return nil
		}
		var r [6]byte
		if _, err := rand.Read(r[:]); err != nil {
			return err
		}
		id = hex.EncodeToString(r[:])
		return b.Put(keyInstance, []byte(id))
	})
	return id, err
}

// PutSandbox writes the document of sandbox id, replacing any previous one.
func (s *Store) PutSandbox(id string, doc []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Put([]byte(id), doc)
	})
}

// DeleteSandbox deletes the document of id; a missing one is not an error.
func (s *Store) DeleteSandbox(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Delete([]byte(id))
	})
}

// Sandboxes returns every sandbox document by id.
func (s *Store) Sandboxes() (map[string][]byte, error) {
	out := map[string][]byte{}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).ForEach(func(k, v []byte) error {
			out[string(k)] = append([]byte(nil), v...)
			return nil
		})
	})
	return out, err
}

// Count returns how many sandbox documents the store holds.
func (s *Store) Count() (int, error) {
	n := 0
	err := s.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketSandboxes).Stats().KeyN
		return nil
	})
	return n, err
}

// PutSnapshot writes the document of snapshot id, replacing any previous one
// (lifecycle.SnapshotStore).
func (s *Store) PutSnapshot(id string, doc []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSnapshots).Put([]byte(id), doc)
	})
}

// DeleteSnapshot deletes the document of snapshot id; a missing one is not an error.
func (s *Store) DeleteSnapshot(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSnapshots).Delete([]byte(id))
	})
}

// Snapshots returns every snapshot document by id.
func (s *Store) Snapshots() (map[string][]byte, error) {
	out := map[string][]byte{}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSnapshots).ForEach(func(k, v []byte) error {
			out[string(k)] = append([]byte(nil), v...)
			return nil
		})
	})
	return out, err
}

// LibraryVersions returns the last applied version of every named policy (the policy
// library's library.Store).
func (s *Store) LibraryVersions() (map[string]library.Stored, error) {
	out := map[string]library.Stored{}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketLibrary).ForEach(func(k, v []byte) error {
			var st library.Stored
			if err := json.Unmarshal(v, &st); err != nil {
				return fmt.Errorf("store: named policy %q: %w", k, err)
			}
			out[string(k)] = st
			return nil
		})
	})
	return out, err
}

// PutLibraryVersion records the applied version of named policy name.
func (s *Store) PutLibraryVersion(name string, st library.Stored) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketLibrary).Put([]byte(name), b)
	})
}

// Keys returns every API key document by principal id (principal.Store).
func (s *Store) Keys() (map[string][]byte, error) {
	out := map[string][]byte{}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketKeys).ForEach(func(k, v []byte) error {
			out[string(k)] = append([]byte(nil), v...)
			return nil
		})
	})
	return out, err
}

// PutKey writes the API key document of principal id (principal.Store).
func (s *Store) PutKey(id string, doc []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketKeys).Put([]byte(id), doc)
	})
}

// DeleteKey removes the API key document of principal id; a missing one is not an
// error (principal.Store).
func (s *Store) DeleteKey(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketKeys).Delete([]byte(id))
	})
}

// Interface guards.
var (
	_ lifecycle.StateStore    = (*Store)(nil)
	_ lifecycle.SnapshotStore = (*Store)(nil)
	_ library.Store           = (*Store)(nil)
	_ principal.Store         = (*Store)(nil)
)
