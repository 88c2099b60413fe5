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

	"github.com/airlockdev/airlock/internal/kubedeploy"
	"github.com/airlockdev/airlock/internal/kubenode"
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

// TestReadmeKubeUp: the commands the READMEs give from an empty host to the SDK are the
// ones the node tests run, so that neither can drift:
//   - testenv/README.md says `make kube-up` and `make kube-down`; the Makefile's kube-up
//     recipe runs exactly kubenode.KubeUp (up.sh, then airlock-up.sh), which the node
//     tests run (kubenode.Start, Node.AirlockUp), and kube-down runs down.sh;
//   - airlock-up.sh builds the images with the operator README's images.sh (step 1) and
//     deploys with testenv/deploy (internal/kubedeploy: steps 3 to 5);
//   - the README's `rollout status` commands (step 4) name exactly the workloads
//     kubedeploy.WaitRollouts waits for (every Deployment and DaemonSet of the base and
//     of the testnode overlay);
//   - the README's SDK snippet (step 6) has the placeholders kubedeploy.SDKSnippet fills
//     in: `make kube-up` prints it filled in and TestAirlockParityOnNode runs it.
func TestReadmeKubeUp(t *testing.T) {
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	recipe := func(target string) []string {
		var out []string
		in := false
		for l := range strings.SplitSeq(read("../../Makefile"), "\n") {
			switch {
			case strings.HasPrefix(l, target+":"):
				in = true
			case in && strings.HasPrefix(l, "\t"):
				out = append(out, strings.TrimPrefix(strings.TrimSpace(l), "@"))
			case in:
				return out
			}
		}
		return out
	}
	var want []string
	for _, s := range kubenode.KubeUp {
		want = append(want, "deploy/kubernetes/testenv/"+s)
	}
	if got := recipe("kube-up"); !slices.Equal(got, want) {
		t.Errorf("make kube-up runs %q, the node tests run %q (kubenode.KubeUp)", got, want)
	}
	if got := recipe("kube-down"); !slices.Equal(got, []string{"deploy/kubernetes/testenv/down.sh"}) {
		t.Errorf("make kube-down runs %q, the node tests run down.sh", got)
	}
	testenvReadme := read("testenv/README.md")
	for _, cmd := range []string{"make kube-up", "make kube-down"} {
		if !regexp.MustCompile("(?s)```sh\n[^`]*\\b" + cmd + "\\b").MatchString(testenvReadme) {
			t.Errorf("testenv/README.md's commands do not start with %q", cmd)
		}
	}

	up := read("testenv/airlock-up.sh")
	sh := strings.Join(readmeBlocks(t, "sh"), "\n")
	for _, cmd := range []string{"deploy/kubernetes/images.sh", "./deploy/kubernetes/testenv/deploy"} {
		if !regexp.MustCompile(`(?m)^[^#\n]*` + regexp.QuoteMeta(cmd) + `\b`).MatchString(up) {
			t.Errorf("airlock-up.sh does not run %s", cmd)
		}
	}
	if !strings.Contains(sh, "deploy/kubernetes/images.sh $REGISTRY") {
		t.Error("the README's step 1 does not build the images with deploy/kubernetes/images.sh, as airlock-up.sh does")
	}

	var rollouts []string
	for _, m := range regexp.MustCompile(`(?m)^kubectl -n airlock-system rollout status (\S+)$`).FindAllStringSubmatch(sh, -1) {
		rollouts = append(rollouts, m[1])
	}
	slices.Sort(rollouts)
	for _, dir := range []string{"base", "overlays/testnode"} {
		m := render(t, dir)
		var workloads []string
		for _, kind := range []string{"Deployment", "DaemonSet"} {
			for _, o := range m.ofKind(kind) {
				workloads = append(workloads, strings.ToLower(kind)+"/"+o.GetName())
			}
		}
		slices.Sort(workloads)
		if !slices.Equal(rollouts, workloads) {
			t.Errorf("the README waits for the rollouts of %q, %s has (and kubedeploy waits for) %q", rollouts, dir, workloads)
		}
	}

	js, err := kubedeploy.SDKSnippet([]byte(read("README.md")), "10.244.0.1:30880", "k", "airlock/sandbox:kubenode")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`domain: "10.244.0.1:30880"`, `apiKey: "k"`, `image: "airlock/sandbox:kubenode"`, "Sandbox.create("} {
		if !strings.Contains(js, w) {
			t.Errorf("the filled-in SDK snippet lacks %s:\n%s", w, js)
		}
	}
}
