package stack

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/egressd/datapath/datapathtest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/sdk"
)

// attribDst is where the attributed flows go: TEST-NET-1, which the host routes as
// unreachable for the test (the SYN is seen by the datapath, then answered with an
// ICMP error by the host, so nothing leaves the machine).
const attribDst = "192.0.2.10"

// attribDenied is where the attributed denied flow goes: TEST-NET-2, which the policy
// does not allow (refused at connect on eBPF, dropped on the veth on nftables).
const attribDenied = "198.51.100.10"

// TestProcessAttribution: in a real sandbox behind each datapath, a curl and a
// python3 -c run through execd (the SDK, through the gateway), a background job a
// command leaves behind, and a curl the entrypoint runs each open a flow whose record
// names the process the kernel saw (pid, parent, executable, command line) and the
// process group it ran in; the command records name the same group, so each flow links
// to its command, and the entrypoint's flow is the entrypoint's. A curl to a denied
// destination is attributed the same way. On the nftables datapath the eBPF socket
// programs, loaded recording only beside the nftables tables, are the witness.
func TestProcessAttribution(t *testing.T) {
	img := testenv.NeedSandboxImage(t)
	testenv.NeedRoot(t)
	testenv.NeedBPF(t)
	exec.Command("ip", "route", "del", "192.0.2.0/24").Run()
	datapathtest.IP(t, "route", "replace", "unreachable", "192.0.2.0/24")
	t.Cleanup(func() { exec.Command("ip", "route", "del", "192.0.2.0/24").Run() })
	t.Run("ebpf", func(t *testing.T) { attribution(t, img, "ebpf") })
	t.Run("nftables", func(t *testing.T) { attribution(t, img, "nftables") })
}

func attribution(t *testing.T, img, mode string) {
	s, c := startTestStack(t, func(cfg *Config) { cfg.Egress.Mode = mode })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	pol := json.RawMessage(`{"defaultAction":"deny","egress":[{"action":"allow","target":"192.0.2.0/24"}]}`)
	entry := fmt.Sprintf("for i in 1 2 3 4 5 6; do curl -s -m 1 http://%s:84/; sleep 1; done; exec tail -f /dev/null", attribDst)
	sb, err := c.Create(ctx, sdk.CreateRequest{Image: img, NetworkPolicy: pol, Entrypoint: []string{"sh", "-c", entry}})
	if err != nil {
		t.Fatal(err)
	}
	x, err := c.Execd(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	cmds := map[int]string{
		81: fmt.Sprintf("curl -s -m 2 http://%s:81/", attribDst),
		82: fmt.Sprintf(`python3 -c 'import socket; socket.create_connection(("%s", 82), 2)'`, attribDst),
		83: fmt.Sprintf("nohup sh -c 'sleep 1; curl -s -m 2 http://%s:83/' >/dev/null 2>&1 &", attribDst),
		85: fmt.Sprintf("curl -s -m 2 http://%s:85/", attribDenied),
	}
	for _, port := range []int{81, 82, 83, 85} {
		if _, err := x.Run(ctx, sdk.Command{Command: cmds[port]}, nil); err != nil {
			t.Fatalf("%s: %v", cmds[port], err)
		}
	}

	dir := filepath.Join(s.cfg.StateDir, "audit")
	flows := map[int]audit.Record{}
	commands := map[int]audit.Record{}
	deadline := time.Now().Add(30 * time.Second)
	for len(flows) < 5 || len(commands) < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("flows %v, commands %v after 30 s", keys(flows), keys(commands))
		}
		time.Sleep(200 * time.Millisecond)
		all, _, err := audit.Query(dir, audit.Filter{SandboxID: sb.ID})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range all {
			switch {
			case r.Source == audit.SourceBPF && (r.DstIP == attribDst && r.Action == "allow" || r.DstIP == attribDenied && r.Action == "deny"):
				if _, ok := flows[r.DstPort]; !ok {
					flows[r.DstPort] = r
				}
			case r.Source == audit.SourceExecd && r.Extra["op"] == "command":
				for port, cmd := range cmds {
					if r.Extra["command"] == cmd {
						commands[port] = r
					}
				}
			}
		}
	}

	for port, exe := range map[int]string{81: "/curl", 82: "/python3", 83: "/curl", 84: "/curl", 85: "/curl"} {
		f := flows[port]
		if f.Extra["backend"] != mode {
			t.Errorf("port %d: backend %v, want %s", port, f.Extra["backend"], mode)
		}
		proc, _ := f.Extra["process"].(map[string]any)
		execution, _ := f.Extra["execution"].(map[string]any)
		if proc == nil || execution == nil {
			t.Errorf("port %d: flow record without process attribution: %+v", port, f.Extra)
			continue
		}
		if pid, _ := proc["pid"].(float64); pid <= 0 {
			t.Errorf("port %d: no pid: %v", port, proc)
		}
		if nsPID, _ := proc["ns_pid"].(float64); nsPID <= 1 {
			t.Errorf("port %d: no pid in the sandbox's namespace (or execd's): %v", port, proc)
		}
		if ppid, _ := proc["ppid"].(float64); ppid <= 0 {
			t.Errorf("port %d: no parent pid: %v", port, proc)
		}
		// The kernel names the executable; the host's /proc gives its path while the
		// process lives (curl ends at once on the unreachable route).
		if got, _ := proc["exe_name"].(string); !strings.HasPrefix("/"+got, exe) {
			t.Errorf("port %d: executable %q (kernel), want %s…", port, got, exe[1:])
		}
		if got, ok := proc["exe"].(string); ok && !strings.Contains(got, exe) {
			t.Errorf("port %d: exe %q, want …%s…", port, got, exe)
		}
		if got, _ := proc["cmdline"].(string); !strings.Contains(got, fmt.Sprint(port)) {
			t.Errorf("port %d: cmdline %q", port, got)
		}
		if port == 84 {
			if execution["by"] != "entrypoint" {
				t.Errorf("the entrypoint's flow is attributed to %v", execution)
			}
			continue
		}
		if execution["by"] != "group" {
			t.Errorf("port %d: execution %v, want a command's process group", port, execution)
		}
		cmd := commands[port]
		group, _ := cmd.Extra["process_group"].(map[string]any)
		if group == nil {
			t.Errorf("port %d: the command record names no process group: %+v", port, cmd.Extra)
			continue
		}
		if group["pgid"] != execution["pgid"] || proc["pgid"] != execution["pgid"] {
			t.Errorf("port %d: flow's group %v (process %v) is not the command's %v", port, execution["pgid"], proc["pgid"], group["pgid"])
		}
		for other, oc := range commands {
			if g, _ := oc.Extra["process_group"].(map[string]any); other != port && g != nil && g["pgid"] == group["pgid"] {
				t.Errorf("commands for ports %d and %d name the same group %v", port, other, g["pgid"])
			}
		}
	}
	// The background job outlived the command that started it: its parent is no
	// longer the command's first process, and its group still is.
	if p, _ := flows[83].Extra["process"].(map[string]any); p != nil && p["ppid"] == p["pgid"] {
		t.Logf("background job's parent is still its group leader: %v", p)
	}
}

func keys[V any](m map[int]V) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	return out
}
