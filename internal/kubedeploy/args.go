package kubedeploy

import (
	"errors"
	"fmt"
)

// ErrNoWorkload is returned by AppendArgs when the manifest has no workload of that kind
// and name, or its pod template has no container.
var ErrNoWorkload = errors.New("no such workload in the manifest")

// AppendArgs appends args to the first container's args of every workload of kind
// (Deployment, DaemonSet) named name in m, before m is applied: a later flag wins over
// the overlay's, as a kustomize patch appending to /spec/template/spec/containers/0/args
// would. deploy/kubernetes/testenv/deploy uses it for options of one deployment only
// (-upstream-ca-file); the manifests stay as the overlay renders them otherwise. It
// returns ErrNoWorkload when nothing matched, and an error naming the object when its
// pod template is not the usual shape.
func (m *Manifest) AppendArgs(kind, name string, args ...string) error {
	found := false
	for _, o := range m.Objects {
		if o.GetKind() != kind || o.GetName() != name {
			continue
		}
		// Walked in place: kustomize's maps hold Go ints, which the unstructured
		// helpers' deep copy refuses.
		spec, _ := o.Object["spec"].(map[string]any)
		tmpl, _ := spec["template"].(map[string]any)
		pod, _ := tmpl["spec"].(map[string]any)
		cs, _ := pod["containers"].([]any)
		if len(cs) == 0 {
			return fmt.Errorf("%s %s: %w (no container)", kind, name, ErrNoWorkload)
		}
		c, ok := cs[0].(map[string]any)
		if !ok {
			return fmt.Errorf("%s %s: container 0 is a %T", kind, name, cs[0])
		}
		have, _ := c["args"].([]any)
		for _, a := range args {
			have = append(have, a)
		}
		c["args"] = have
		found = true
	}
	if !found {
		return fmt.Errorf("%s %s: %w", kind, name, ErrNoWorkload)
	}
	return nil
}
