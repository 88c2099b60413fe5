package manifests_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/airlockdev/airlock/policies"
)

// TestPolicyLibrary: the airlock-policies ConfigMap that lifecycle mounts as its
// --policy-dir holds valid named policies, each a copy of deploy/policies/.
func TestPolicyLibrary(t *testing.T) {
	m := render(t, "base")
	d := typed[appsv1.Deployment](t, m.find("Deployment", "airlock-system", "airlock-lifecycle"))
	c := d.Spec.Template.Spec.Containers[0]
	wantArgs(t, "lifecycle", c.Args, "--policy-dir=/etc/airlock/policies")
	var cmName string
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && strings.HasPrefix(v.ConfigMap.Name, "airlock-policies") {
			cmName = v.ConfigMap.Name
			i := slices.IndexFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool { return vm.Name == v.Name })
			if i < 0 || c.VolumeMounts[i].MountPath != "/etc/airlock/policies" {
				t.Errorf("the policies ConfigMap is not mounted at /etc/airlock/policies: %+v", c.VolumeMounts)
			}
		}
	}
	cm := m.find("ConfigMap", "airlock-system", cmName)
	if cm == nil {
		t.Fatalf("lifecycle mounts no airlock-policies ConfigMap (volumes %+v)", d.Spec.Template.Spec.Volumes)
	}
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	if len(data) == 0 {
		t.Fatal("the policy library is empty")
	}
	for file, text := range data {
		p, err := policies.Parse(file, []byte(text))
		if err != nil {
			t.Errorf("%s: %v", file, err)
			continue
		}
		if want := strings.TrimSuffix(file, filepath.Ext(file)); p.Name != "" && p.Name != want {
			t.Errorf("%s: names itself %q", file, p.Name)
		}
		orig, err := os.ReadFile(filepath.Join("..", "policies", file))
		if err != nil || !bytes.Equal(orig, []byte(text)) {
			t.Errorf("%s differs from deploy/policies/%s (copy it again): %v", file, file, err)
		}
	}
}
