package kubenode

import (
	"testing"

	"github.com/airlockdev/airlock/internal/kubedeploy"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/sdk"
)

// deployed is the start of a node test that needs Airlock on the node: root and the
// sandbox image required, the node started (Start) with the image tagged for it,
// Airlock deployed by `make kube-up`'s scripts (AirlockUp), and an SDK client of its
// lifecycle API. When the test fails, the last logLines lines of each Airlock pod's
// log are printed.
func deployed(t *testing.T, logLines int64) (*Node, Airlock, *sdk.Client) {
	t.Helper()
	testenv.NeedRoot(t)
	img := testenv.NeedSandboxImage(t)
	n := Start(t)
	tagImage(t, img, nodeSandboxImage)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Airlock's pods at the end of the failed test:\n%s", podLogs(n, kubedeploy.SystemNamespace, logLines))
		}
	})
	a := n.AirlockUp(t, nodeSandboxImage)
	c, err := sdk.New(sdk.Config{BaseURL: "http://" + a.API, APIKey: a.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	return n, a, c
}
