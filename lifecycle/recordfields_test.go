package lifecycle

import (
	"reflect"
	"strings"
	"testing"

	"github.com/airlockdev/airlock/lifecycle/kubestore/v1alpha1"
)

// TestRecordFieldsHaveAPlaceOnKubernetes: every JSON field of a sandbox record has a
// place in the airlock.dev/v1alpha1 Sandbox resource (lifecycle/kubestore maps them by
// JSON name and refuses a record with a field it cannot place, so a field added here
// and not there fails every create on Kubernetes).
func TestRecordFieldsHaveAPlaceOnKubernetes(t *testing.T) {
	names := func(t reflect.Type) map[string]bool {
		out := map[string]bool{}
		for i := range t.NumField() {
			if n, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); n != "" && n != "-" {
				out[n] = true
			}
		}
		return out
	}
	spec, status := names(reflect.TypeFor[v1alpha1.SandboxSpec]()), names(reflect.TypeFor[v1alpha1.SandboxStatus]())
	for n := range names(reflect.TypeFor[record]()) {
		switch {
		case n == "id" || n == "accessToken" || n == "status": // the name, the Secret, status.sandboxStatus
		case spec[n] || status[n]:
		default:
			t.Errorf("record field %q has no place in %s: add it to lifecycle/kubestore/v1alpha1 and run make generate", n, v1alpha1.APIVersion)
		}
	}
}
