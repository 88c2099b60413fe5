package lifecycle

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/policies/library"
)

// LibraryWriter is a PolicyLibrary that lifecycle may write into (policies/library's
// Library is one): Dir is the directory of its files, Reload reads it again at once
// (the hot reload would, a debounce later) and returns only a store failure. A library
// that is not a LibraryWriter, or whose Dir is empty, cannot take an approved proposal
// (POST /sandboxes/{id}/policy/proposal with saveAs answers 501).
type LibraryWriter interface {
	PolicyLibrary
	Dir() string
	Reload() error
}

// libraryExts are the file extensions a library policy may have (package
// policies/library reads *.yaml, *.yml and *.json).
var libraryExts = []string{".yaml", ".yml", ".json"}

// savedPolicy is what writeLibraryPolicy wrote: the file and the library's version of
// the policy once reloaded.
type savedPolicy struct {
	Name, File, SHA256 string
	Version            uint64
}

// writeLibraryPolicy writes doc (a policy in the library's YAML) into the library lib
// as policy name, and reloads the library so that it serves it at once. want is the
// policy doc must mean: doc is parsed by the library's own parser (policies.Parse)
// first and refused unless it parses to want, so nothing the library would reject is
// ever written.
//
// The write is atomic: a hidden temporary file in the directory (the library ignores
// hidden files), synced, then linked to name.yaml (a name taken meanwhile fails: no
// silent overwrite) or, with replace, renamed over the policy's existing file (its
// extension kept). A name the library knows (even as removed, for the sandboxes that
// still use its last version) or that any file name.{yaml,yml,json} holds is taken:
// ErrPolicyExists unless replace. Errors: ErrInvalidRequest for a name that cannot
// name a policy, ErrNotImplemented without a writable library, ErrPolicyExists; others
// are internal (I/O, a library that did not take the file).
func writeLibraryPolicy(lib PolicyLibrary, name string, doc []byte, want *policies.Policy, replace bool) (savedPolicy, error) {
	lw, ok := lib.(LibraryWriter)
	if !ok || lw.Dir() == "" {
		return savedPolicy{}, fmt.Errorf("%w: this server has no policy library directory to write into (policies.dir)", ErrNotImplemented)
	}
	if !library.ValidName(name) {
		return savedPolicy{}, fmt.Errorf("%w: saveAs %q: a policy name is a DNS label (lowercase letters, digits, '-', at most 63)", ErrInvalidRequest, name)
	}
	dir := lw.Dir()
	file := filepath.Join(dir, name+".yaml")
	existing := ""
	for _, ext := range libraryExts {
		if _, err := os.Lstat(filepath.Join(dir, name+ext)); err == nil {
			existing = filepath.Join(dir, name+ext)
			break
		}
	}
	_, known := lw.Get(name)
	if (known || existing != "") && !replace {
		return savedPolicy{}, fmt.Errorf("%w: the library already has a policy %q; choose another name or replace it (replace: true)", ErrPolicyExists, name)
	}
	if existing != "" {
		file = existing
	}
	parsed, err := policies.Parse(file, doc)
	if err != nil {
		return savedPolicy{}, fmt.Errorf("the proposed policy does not parse as a library file: %w", err)
	}
	if a, b := mustJSON(parsed), mustJSON(want); a != b {
		return savedPolicy{}, fmt.Errorf("the proposed policy's YAML parses to another policy: %s, want %s", a, b)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return savedPolicy{}, err
	}
	tmp, err := os.CreateTemp(dir, "."+name+".*.tmp")
	if err != nil {
		return savedPolicy{}, err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(doc)
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return savedPolicy{}, err
	}
	if replace {
		err = os.Rename(tmp.Name(), file)
	} else if err = os.Link(tmp.Name(), file); errors.Is(err, os.ErrExist) {
		return savedPolicy{}, fmt.Errorf("%w: a policy file %s appeared meanwhile", ErrPolicyExists, filepath.Base(file))
	}
	if err != nil {
		return savedPolicy{}, err
	}
	if d, err := os.Open(dir); err == nil { // the new name survives a crash
		_ = d.Sync()
		d.Close()
	}
	if err := lw.Reload(); err != nil {
		return savedPolicy{}, err
	}
	sum := sha256.Sum256(doc)
	hash := hex.EncodeToString(sum[:])
	p, ok := lw.Get(name)
	if !ok || p.SHA256 != hash || p.Removed {
		return savedPolicy{}, fmt.Errorf("the library did not take %s (see its log)", file)
	}
	return savedPolicy{Name: name, File: file, SHA256: hash, Version: p.Version}, nil
}

// mustJSON is p in Airlock's JSON form (for comparing two parsed policies).
func mustJSON(p *policies.Policy) string {
	b, err := json.Marshal(p)
	if err != nil {
		return "unmarshalable: " + err.Error()
	}
	return string(b)
}
