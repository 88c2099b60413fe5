package kubenode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/opensandbox"
)

// TestCommandGroupOnNode: on Kubernetes a flow record links to the execd command that
// opened it, as with `airlock up`. A command (python3 sending a datagram the policy
// denies) run through the gateway gets, in the gateway's audit log on the node, a
// command record whose extra.process_group is the group the node's egressd found for
// it (egressd.GroupsHandler, asked by the gateway through the pod's hostIP), and the
// kernel names the same group (extra.execution.pgid, and the same in the pod's pid
// namespace) in the flow's record in egressd's audit log. The same command run through
// lifecycle's server proxy gets the same link in lifecycle's audit log (lifecycle
// asks the node's egressd too: cluster NodeGroups).
func TestCommandGroupOnNode(t *testing.T) {
	n, a, c := deployed(t, 40)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	id := runningSandbox(ctx, t, c, `{"defaultAction":"deny"}`, "tail", "-f", "/dev/null")

	command := func(port int) string {
		return fmt.Sprintf(`python3 -c "
import socket
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
try: s.sendto(b'x',('169.254.169.254',%d))
except OSError: pass
print('sent')"`, port)
	}
	// check finds the flow of the datagram to port in egressd's log and the record of
	// the command that sent it in the logs under auditDirs (a glob), and wants them
	// linked by the process group.
	check := func(via string, port int, auditDirs string) {
		t.Helper()
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
			t.Fatalf("%s: the flow's execution %v: want a command's group", via, execution)
		}
		var rec *audit.Record
		n.Wait(t, via+"'s record of the command", 60*time.Second, func() (bool, error) {
			dirs, err := filepath.Glob(auditDirs)
			if err != nil {
				return false, err
			}
			for _, dir := range dirs {
				recs, err := audit.Tail(dir, 1000, audit.Filter{SandboxID: id})
				if err != nil {
					return false, err
				}
				for _, r := range recs {
					if r.Source == audit.SourceExecd && r.Extra["op"] == "command" && strings.Contains(str(r.Extra["command"]), strconv.Itoa(port)) {
						rec = &r
						return true, nil
					}
				}
			}
			return false, nil
		})
		b, _ := json.Marshal(rec.Extra["process_group"])
		var group struct {
			PGID   int `json:"pgid"`
			NSPGID int `json:"ns_pgid"`
		}
		if rec.Extra["process_group"] == nil || json.Unmarshal(b, &group) != nil {
			all, _ := json.Marshal(rec)
			t.Fatalf("%s: the command's record names no process group: %s", via, all)
		}
		if float64(group.PGID) != flowPGID {
			t.Errorf("%s: the command's process group %d, the flow's %v: want the same", via, group.PGID, flowPGID)
		}
		if nsPGID, _ := proc["ns_pgid"].(float64); group.NSPGID <= 1 || float64(group.NSPGID) != nsPGID {
			t.Errorf("%s: the command's group in the pod's pid namespace %d, the flow process's %v: want the same, above execd's 1", via, group.NSPGID, proc["ns_pgid"])
		}
		t.Logf("%s: command record %s names process group %s; the flow's execution %v", via, rec.Extra["request_id"], b, execution)
	}

	if got := runIn(ctx, t, c, id, command(9977)); got != "sent" {
		t.Fatalf("the command printed %q", got)
	}
	check("the gateway", 9977, filepath.Join(GatewayAuditDir, "*", "audit"))

	body, _ := json.Marshal(map[string]string{"command": command(9978)})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+a.API+"/v1/sandboxes/"+id+"/proxy/44772/command", bytes.NewReader(body))
	req.Header.Set(opensandbox.HeaderAPIKey, a.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("command through lifecycle's server proxy: %v", err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(out), "sent") {
		t.Fatalf("command through lifecycle's server proxy: HTTP %d %s", resp.StatusCode, out)
	}
	check("lifecycle's server proxy", 9978, filepath.Join(LifecycleAuditDir, "*", "audit"))
}

// str is v when it is a string, "" otherwise.
func str(v any) string {
	s, _ := v.(string)
	return s
}
