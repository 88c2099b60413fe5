package lifecycle

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/policies/library"
)

// kubeLike is a Runtime that cannot snapshot (a runtime of kind kubernetes without
// snapshots, as the Kubernetes runtime without kube.Config.Snapshots).
type kubeLike struct{}

func (kubeLike) Kind() string                                   { return "kubernetes" }
func (kubeLike) Create(context.Context, Spec) (Instance, error) { return Instance{}, ErrInstanceGone }
func (kubeLike) Remove(context.Context, Instance) error         { return nil }
func (kubeLike) Pause(context.Context, string) error            { return ErrNotImplemented }
func (kubeLike) Resume(context.Context, string) error           { return ErrNotImplemented }
func (kubeLike) Inspect(context.Context, string) (Instance, error) {
	return Instance{}, ErrInstanceGone
}
func (kubeLike) List(context.Context) ([]Instance, error) { return nil, nil }

// memStore is a StateStore without snapshots.
type memStore struct{}

func (memStore) InstanceID() (string, error)                         { return "0123456789ab", nil }
func (memStore) PutSandbox(string, []byte) error                     { return nil }
func (memStore) DeleteSandbox(string) error                          { return nil }
func (memStore) Sandboxes() (map[string][]byte, error)               { return nil, nil }
func (memStore) LibraryVersions() (map[string]library.Stored, error) { return nil, nil }
func (memStore) PutLibraryVersion(string, library.Stored) error      { return nil }

// TestSnapshotsNotImplemented: on a runtime that cannot snapshot, every snapshot route
// and a restore answer 501 NOT_IMPLEMENTED naming the runtime.
func TestSnapshotsNotImplemented(t *testing.T) {
	srv, err := New(Config{Runtime: kubeLike{}, Store: memStore{}})
	if err != nil {
		t.Fatal(err)
	}
	h := srv.Handler()
	for _, tc := range [][3]string{
		{"GET", "/v1/snapshots", ""},
		{"GET", "/v1/snapshots/snap-x", ""},
		{"DELETE", "/v1/snapshots/snap-x", ""},
		{"POST", "/v1/sandboxes/x/snapshots", "{}"},
		{"POST", "/v1/sandboxes", `{"snapshotId":"snap-x","resourceLimits":{"cpu":"1"}}`},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc[0], tc[1], strings.NewReader(tc[2])))
		var e opensandbox.ErrorBody
		_ = json.Unmarshal(rec.Body.Bytes(), &e)
		if rec.Code != http.StatusNotImplemented || e.Code != "NOT_IMPLEMENTED" || !strings.Contains(e.Message, "kubernetes") {
			t.Errorf("%s %s: %d %s", tc[0], tc[1], rec.Code, rec.Body)
		}
	}
}
