package egressd

import (
	"testing"

	"github.com/moby/moby/client"

	"github.com/airlockdev/airlock/egressd/enforcer"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
)

// TestEgressdOnGVisor runs the whole enforcement suite (bypass attempts included) on
// sandboxes under gVisor's runsc, once per backend. The runtime's Sentry makes every
// network system call of the sandbox on the host, from the sandbox's network namespace
// (runsc --network=host, lifecycle/docker/README.md#gvisor) and, once lifecycle has
// given it a cgroup v2 of its own, from the sandbox's cgroup: so the eBPF socket
// programs still refuse with EPERM and the veth filter still sees every packet.
func TestEgressdOnGVisor(t *testing.T) {
	testenv.NeedRoot(t)
	res, err := lctest.Docker(t).Info(t.Context(), client.InfoOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := res.Info.Runtimes["runsc"]; !ok {
		testenv.SkipOrFail(t, "the engine has no runtime runsc: run make prepare")
	}
	w := newWorld(t, func(o *lctest.Options) { o.OCIRuntime = "runsc" })
	for _, mode := range []enforcer.Mode{enforcer.ModeEBPF, enforcer.ModeNFTables} {
		t.Run(string(mode), func(t *testing.T) { w.suite(t, mode) })
	}
}
