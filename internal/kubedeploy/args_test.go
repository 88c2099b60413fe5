package kubedeploy

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"
)

// TestAppendArgs renders the testnode overlay and appends a flag to egressd's DaemonSet:
// the rendered args keep the overlay's and end with it; an unknown workload is
// ErrNoWorkload.
func TestAppendArgs(t *testing.T) {
	m, err := Render(filepath.Join("..", "..", "deploy", "kubernetes", "overlays", "testnode"))
	if err != nil {
		t.Fatal(err)
	}
	args := func() []string {
		for _, o := range m.Objects {
			if o.GetKind() == "DaemonSet" && o.GetName() == "airlock-egressd" {
				// By hand: kustomize's maps hold Go ints, which unstructured's deep copy refuses.
				cs := o.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)
				var out []string
				for _, a := range cs[0].(map[string]any)["args"].([]any) {
					out = append(out, a.(string))
				}
				return out
			}
		}
		t.Fatal("no airlock-egressd DaemonSet in the testnode overlay")
		return nil
	}
	before := args()
	if err := m.AppendArgs("DaemonSet", "airlock-egressd", "--upstream-ca-file=/var/lib/airlock/ca.pem"); err != nil {
		t.Fatal(err)
	}
	after := args()
	if want := append(slices.Clone(before), "--upstream-ca-file=/var/lib/airlock/ca.pem"); !slices.Equal(after, want) {
		t.Errorf("args after AppendArgs %q, want %q", after, want)
	}
	if err := m.AppendArgs("DaemonSet", "no-such", "--x"); !errors.Is(err, ErrNoWorkload) {
		t.Errorf("AppendArgs of a missing workload: %v, want ErrNoWorkload", err)
	}
}
