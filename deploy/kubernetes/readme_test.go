package manifests_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// readmeBlocks returns the README's fenced code blocks of language lang.
func readmeBlocks(t *testing.T, lang string) []string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)```" + lang + "\n(.*?)```")
	var out []string
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		// Blocks are indented inside list items.
		var lines []string
		indent := len(m[1]) - len(strings.TrimLeft(m[1], " "))
		for l := range strings.SplitSeq(m[1], "\n") {
			lines = append(lines, strings.TrimPrefix(l, strings.Repeat(" ", indent)))
		}
		out = append(out, strings.Join(lines, "\n"))
	}
	return out
}

// TestReadmeOverlay renders the operator overlay of the README's step 2 and checks
// that it changes what it says: the airlock image and the execd image setting.
func TestReadmeOverlay(t *testing.T) {
	var overlay string
	for _, b := range readmeBlocks(t, "yaml") {
		if strings.Contains(b, "kind: Kustomization") {
			overlay = b
		}
	}
	if overlay == "" {
		t.Fatal("README.md has no overlay (a yaml block with kind: Kustomization)")
	}
	if !strings.Contains(overlay, "- ../../base") {
		t.Fatalf("the README overlay does not start from ../../base:\n%s", overlay)
	}
	// Where the README puts it: beside the other overlays (kustomize only loads bases
	// from below or beside the kustomization).
	dir, err := os.MkdirTemp("overlays", ".readme-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(overlay), 0o644); err != nil {
		t.Fatal(err)
	}
	m := render(t, dir)
	for _, name := range []string{"airlock-lifecycle", "airlock-gateway"} {
		d := typed[appsv1.Deployment](t, m.find("Deployment", "airlock-system", name))
		if img := d.Spec.Template.Spec.Containers[0].Image; img != "registry.example.com/airlock/airlock:0.1.0" {
			t.Errorf("%s: image %q after the README overlay", name, img)
		}
	}
	d := typed[appsv1.Deployment](t, m.find("Deployment", "airlock-system", "airlock-lifecycle"))
	wantArgs(t, "lifecycle", m.args(t, "airlock-system", d.Spec.Template.Spec.Containers[0]),
		"--execd-image=registry.example.com/airlock/execd:0.1.0", "--namespace=airlock-sandboxes")
}

// TestReadmeSecretAndSettings: the README's secret command creates what the pods
// reference, and its settings table lists exactly the keys of base/settings.env.
func TestReadmeSecretAndSettings(t *testing.T) {
	m := render(t, "base")
	refs := map[string]bool{} // "secret/key"
	for _, o := range m.objs {
		var spec corev1.PodSpec
		switch o.GetKind() {
		case "Deployment":
			spec = typed[appsv1.Deployment](t, o).Spec.Template.Spec
		case "DaemonSet":
			spec = typed[appsv1.DaemonSet](t, o).Spec.Template.Spec
		default:
			continue
		}
		for _, c := range spec.Containers {
			for _, e := range c.Env {
				if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil {
					refs[r.SecretKeyRef.Name+"/"+r.SecretKeyRef.Key] = true
				}
			}
		}
	}
	var created []string
	for _, b := range readmeBlocks(t, "sh") {
		if mm := regexp.MustCompile(`create secret generic (\S+)`).FindStringSubmatch(b); mm != nil {
			for _, k := range regexp.MustCompile(`--from-literal=([a-z-]+)=`).FindAllStringSubmatch(b, -1) {
				created = append(created, mm[1]+"/"+k[1])
			}
		}
	}
	for r := range refs {
		if !slices.Contains(created, r) {
			t.Errorf("the pods read Secret key %s, which the README does not create (creates %v)", r, created)
		}
	}
	if len(created) != len(refs) {
		t.Errorf("the README creates %v, the pods read %v", created, refs)
	}

	env, err := os.ReadFile("base/settings.env")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for l := range strings.SplitSeq(string(env), "\n") {
		if k, _, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(l, "#") {
			keys = append(keys, k)
		}
	}
	var rows []string
	for _, mm := range regexp.MustCompile("(?m)^\\| `(AIRLOCK_[A-Z0-9_]+)` \\|").FindAllStringSubmatch(string(readme), -1) {
		rows = append(rows, mm[1])
	}
	slices.Sort(keys)
	slices.Sort(rows)
	if !slices.Equal(keys, rows) {
		t.Errorf("README settings table %v, base/settings.env %v", rows, keys)
	}
}
