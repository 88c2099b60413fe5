package boltstore

import (
	"maps"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/airlockdev/airlock/policies/library"
)

func TestRoundTripAcrossReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "lifecycle.db")
	st, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := st.InstanceID()
	if err != nil || len(inst) != 12 {
		t.Fatalf("instance id %q, %v: want 12 hex digits", inst, err)
	}
	docs := map[string][]byte{"a1": []byte(`{"id":"a1"}`), "b2": []byte(`{"id":"b2"}`)}
	for id, doc := range docs {
		if err := st.PutSandbox(id, doc); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.PutSandbox("gone", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteSandbox("gone"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteSandbox("never-there"); err != nil {
		t.Fatalf("deleting a missing sandbox: %v", err)
	}
	v := library.Stored{Version: 3, SHA256: "abc", File: "team.yaml", Source: []byte("defaultAction: deny\n")}
	if err := st.PutLibraryVersion("team", v); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if again, _ := st.InstanceID(); again != inst {
		t.Fatalf("instance id changed across reopen: %q, then %q", inst, again)
	}
	got, err := st.Sandboxes()
	if err != nil || !maps.EqualFunc(got, docs, func(a, b []byte) bool { return string(a) == string(b) }) {
		t.Fatalf("sandboxes %q, %v; want %q", got, err, docs)
	}
	if n, err := st.Count(); err != nil || n != 2 {
		t.Fatalf("count %d, %v; want 2", n, err)
	}
	lv, err := st.LibraryVersions()
	if err != nil || len(lv) != 1 || lv["team"].Version != 3 || string(lv["team"].Source) != string(v.Source) {
		t.Fatalf("library versions %+v, %v", lv, err)
	}
}

// TestOnDiskFormat pins the buckets and keys: a database written by an older Airlock
// must open unchanged.
func TestOnDiskFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lifecycle.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for bucket, kv := range map[string][2]string{
			"sandboxes":      {"s1", `{"id":"s1"}`},
			"meta":           {"instance", "0123456789ab"},
			"policy-library": {"team", `{"version":7,"sha256":"x","file":"team.yaml","source":null}`},
		} {
			b, err := tx.CreateBucket([]byte(bucket))
			if err != nil {
				return err
			}
			if err := b.Put([]byte(kv[0]), []byte(kv[1])); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()

	st, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if inst, _ := st.InstanceID(); inst != "0123456789ab" {
		t.Errorf("instance id %q", inst)
	}
	if docs, _ := st.Sandboxes(); string(docs["s1"]) != `{"id":"s1"}` || len(docs) != 1 {
		t.Errorf("sandboxes %q", docs)
	}
	if lv, _ := st.LibraryVersions(); lv["team"].Version != 7 {
		t.Errorf("library versions %+v", lv)
	}
}

func TestCloseNil(t *testing.T) {
	var st *Store
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotsBucket: snapshot documents round-trip across a reopen, apart from the
// sandboxes', and a delete (also of a missing id) sticks.
func TestSnapshotsBucket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lifecycle.db")
	st, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"snap-a", "snap-b"} {
		if err := st.PutSnapshot(id, []byte(`{"id":"`+id+`"}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.DeleteSnapshot("snap-a"); err != nil || st.DeleteSnapshot("snap-nosuch") != nil {
		t.Fatal(err)
	}
	st.Close()
	if st, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got, err := st.Snapshots()
	if err != nil || len(got) != 1 || string(got["snap-b"]) != `{"id":"snap-b"}` {
		t.Fatalf("snapshots after reopen: %q %v", got, err)
	}
	if sb, _ := st.Sandboxes(); len(sb) != 0 {
		t.Errorf("snapshots leak into sandboxes: %q", sb)
	}
}
