package kubenode

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/internal/kubedeploy"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
	"github.com/airlockdev/airlock/sdk"
)

// LifecycleAuditDir is where the testnode overlay keeps the lifecycle pods' audit logs
// on the node (a hostPath made by up.sh): <pod name>/audit, its key <pod name>/audit.key.
const LifecycleAuditDir = StateDir + "/lifecycle"

// TestLifecycleAuditOnNode: on Kubernetes every lifecycle replica writes its
// control-plane records to a signed audit chain of its own (airlock lifecycle
// --audit-dir). Through the lifecycle API's NodePort, with the key of an operator
// principal made through /v1/keys, the test creates a sandbox, puts its policy, runs a
// command through the server proxy, signs in to the console and deletes the sandbox;
// then it deletes the lifecycle pods (each closes its log, sealing it with a signed
// head), checks every pod's chain on the node with audit.Verify and the public key
// generated beside it (its signed checkpoints, its signed head), and finds the records, each with the principal's id: control
// records sandbox.create, policy.put, sandbox.delete and console.sign_in, the sandbox's
// policy version, and the command's execd record from the server proxy.
func TestLifecycleAuditOnNode(t *testing.T) {
	n, a, admin := deployed(t, 80)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	key, err := admin.CreateKey(ctx, "lc-audit-operator", principal.Operator)
	if err != nil {
		t.Fatalf("POST /v1/keys: %v", err)
	}
	op, err := sdk.New(sdk.Config{BaseURL: "http://" + a.API, APIKey: key.Key})
	if err != nil {
		t.Fatal(err)
	}
	id := runningSandbox(ctx, t, op, `{"defaultAction":"deny"}`, "tail", "-f", "/dev/null")
	if _, err := op.SetPolicy(ctx, id, json.RawMessage(`{"defaultAction":"deny","egress":[{"action":"allow","target":"198.51.100.7/32"}]}`)); err != nil {
		t.Fatalf("PUT policy: %v", err)
	}
	// A command through lifecycle's own server proxy (the SDK's endpoints name the
	// gateway): an agent action with entry server_proxy.
	post := func(u string, body io.Reader, hdr map[string]string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u, body)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", u, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, body := post("http://"+a.API+"/v1/sandboxes/"+id+"/proxy/44772/command", strings.NewReader(`{"command":"echo lc-audit"}`),
		map[string]string{opensandbox.HeaderAPIKey: key.Key, "Content-Type": "application/json"}); st != http.StatusOK || !strings.Contains(body, "lc-audit") {
		t.Fatalf("command through the server proxy: HTTP %d %s", st, body)
	}
	if st, body := post("http://"+a.API+"/console/login", strings.NewReader(url.Values{"key": {key.Key}}.Encode()),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://" + a.API, "Sec-Fetch-Site": "same-origin"}); st != http.StatusSeeOther {
		t.Fatalf("console sign-in: HTTP %d %s", st, body)
	}
	if err := op.Kill(ctx, id); err != nil {
		t.Fatalf("DELETE sandbox: %v", err)
	}

	// The pods go (each closes its log: flushed, a signed head); their logs stay on the node.
	pods, err := n.Client.CoreV1().Pods(kubedeploy.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=airlock-lifecycle"})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("lifecycle pods: %v", err)
	}
	for _, p := range pods.Items {
		if err := n.Client.CoreV1().Pods(kubedeploy.SystemNamespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	n.Wait(t, "the lifecycle pods to go", 2*time.Minute, func() (bool, error) {
		for _, p := range pods.Items {
			if _, err := n.Client.CoreV1().Pods(kubedeploy.SystemNamespace).Get(ctx, p.Name, metav1.GetOptions{}); err == nil {
				return false, nil
			}
		}
		return true, nil
	})

	found := map[string]*audit.Record{}
	checkpoints := 0
	for _, p := range pods.Items {
		dir := filepath.Join(LifecycleAuditDir, p.Name, "audit")
		pub, err := audit.LoadPublicKey(dir + ".pub")
		if err != nil {
			t.Errorf("lifecycle pod %s: no signing public key beside its log: %v", p.Name, err)
			continue
		}
		rep, err := audit.Verify(dir, audit.VerifyOptions{PublicKey: pub})
		if err != nil {
			t.Errorf("audit.Verify of lifecycle pod %s's log: %v (%+v)", p.Name, err, rep)
			continue
		}
		// The testnode overlay seals a file every 4 KiB: the replica that served the
		// calls has signed checkpoints; the head, written at Close, is signed in every log.
		checkpoints += rep.Checkpoints
		if rep.VerifiedSignatures < rep.Checkpoints || rep.Head == nil || !rep.Head.Signed || rep.Head.Seq != rep.LastSeq {
			t.Errorf("lifecycle pod %s: checkpoints %d, signatures verified %d, head %+v, last seq %d: want every checkpoint and the head signed",
				p.Name, rep.Checkpoints, rep.VerifiedSignatures, rep.Head, rep.LastSeq)
		}
		b, _ := json.Marshal(rep)
		t.Logf("lifecycle pod %s: %s", p.Name, b)
		err = audit.Scan(dir, audit.Filter{}, func(r audit.Record) error {
			var what string
			switch r.Source {
			case audit.SourceControl:
				what, _ = r.Extra["op"].(string)
				if target, _ := r.Extra["target"].(string); what != "console.sign_in" && r.SandboxID != id && target != id {
					return nil
				}
			case audit.SourcePolicy:
				what = "policy-version"
			case audit.SourceExecd:
				if e, _ := r.Extra["entry"].(string); e == "server_proxy" {
					what = "execd.server_proxy"
				}
			}
			if what == "" || (r.SandboxID != "" && r.SandboxID != id) {
				return nil
			}
			if p, _ := r.Extra["principal"].(string); p != key.ID {
				return nil
			}
			found[what] = &r
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checkpoints == 0 {
		t.Error("no signed checkpoint in any lifecycle pod's log (the testnode overlay seals files at 4 KiB)")
	}
	for _, what := range []string{"sandbox.create", "policy.put", "sandbox.delete", "console.sign_in", "policy-version", "execd.server_proxy"} {
		r := found[what]
		if r == nil {
			t.Errorf("no %s record of principal %s (sandbox %s) in the lifecycle pods' logs", what, key.ID, id)
			continue
		}
		b, _ := json.Marshal(r)
		t.Logf("%s: %s", what, b)
		if strings.Contains(string(b), key.Key) {
			t.Errorf("the %s record carries the API key", what)
		}
	}
}
