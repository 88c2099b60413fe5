package kubenode

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
)

// TestCommandGroupOnNode: on Kubernetes a flow record links to the execd command that
// opened it, as with `airlock up`. A command run through the gateway (python3 sending
// a datagram the policy denies) gets, in the gateway's audit log on the node, a
// command record whose extra.process_group is the group the node's egressd found for
// it (egressd.GroupsHandler, asked by the gateway through the pod's hostIP), and the
// kernel names the same group (extra.execution.pgid, and the same in the pod's pid
// namespace) in the flow's record in egressd's audit log.
func TestCommandGroupOnNode(t *testing.T) {
	n, _, c := deployed(t, 40)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	id := runningSandbox(ctx, t, c, `{"defaultAction":"deny"}`, "tail", "-f", "/dev/null")

	const port = 9977
	cmd := `python3 -c "
import socket
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
try: s.sendto(b'x',('169.254.169.254',9977))
except OSError: pass
print('sent')"`
	if got := runIn(ctx, t, c, id, cmd); got != "sent" {
		t.Fatalf("the command printed %q", got)
	}

	var flow audit.Record
	n.Wait(t, "egressd's record of the denied datagram", 60*time.Second, func() (bool, error) {
		recs, _, err := audit.Query(filepath.Join(StateDir, "egressd", "audit"), audit.Filter{SandboxID: id})
		if err != nil {
			return false, err
		}
		if d := denials(recs, "udp", "169.254.169.254", port); len(d) > 0 {
			flow = d[0]
			return true, nil
		}
		return false, nil
	})
	execution, _ := flow.Extra["execution"].(map[string]any)
	proc, _ := flow.Extra["process"].(map[string]any)
	flowPGID, _ := execution["pgid"].(float64)
	if execution["by"] != "group" || flowPGID <= 0 {
		t.Fatalf("the flow's execution %v: want a command's group", execution)
	}

	var command *audit.Record
	n.Wait(t, "the gateway's record of the command", 60*time.Second, func() (bool, error) {
		dirs, err := filepath.Glob(filepath.Join(GatewayAuditDir, "*", "audit"))
		if err != nil {
			return false, err
		}
		for _, dir := range dirs {
			recs, err := audit.Tail(dir, 1000, audit.Filter{SandboxID: id})
			if err != nil {
				return false, err
			}
			for _, r := range recs {
				if r.Source == audit.SourceExecd && r.Extra["op"] == "command" && strings.Contains(str(r.Extra["command"]), "9977") {
					command = &r
					return true, nil
				}
			}
		}
		return false, nil
	})
	b, _ := json.Marshal(command.Extra["process_group"])
	var group struct {
		PGID   int `json:"pgid"`
		NSPGID int `json:"ns_pgid"`
	}
	if command.Extra["process_group"] == nil || json.Unmarshal(b, &group) != nil {
		all, _ := json.Marshal(command)
		t.Fatalf("the command's record names no process group: %s", all)
	}
	if float64(group.PGID) != flowPGID {
		t.Errorf("the command's process group %d, the flow's %v: want the same", group.PGID, flowPGID)
	}
	if nsPGID, _ := proc["ns_pgid"].(float64); group.NSPGID <= 1 || float64(group.NSPGID) != nsPGID {
		t.Errorf("the command's group in the pod's pid namespace %d, the flow process's %v: want the same, above execd's 1", group.NSPGID, proc["ns_pgid"])
	}
	t.Logf("command record %s names process group %s; the flow's execution %v", command.Extra["request_id"], b, execution)
}

// str is v when it is a string, "" otherwise.
func str(v any) string {
	s, _ := v.(string)
	return s
}
