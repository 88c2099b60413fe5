package cluster

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/airlockdev/airlock/lifecycle/kube"
	"github.com/airlockdev/airlock/lifecycle/watch"
)

// gateInterval spaces the questions about one sandbox (a local HTTP GET to the node's
// egressd each; a claim from a warm pool and a policy change wait on them, so the
// spacing is part of their latency); maxGateEntries bounds what the gate remembers
// (node addresses are asked again after a reset).
const (
	gateInterval   = 5 * time.Millisecond
	maxGateEntries = 100000
)

// enforcementGate asks the egressd of a sandbox pod's node (status.hostIP, port)
// whether it enforces the sandbox (watch.EnforcedPath): lifecycle's ReadyGate and
// PolicyGate on Kubernetes, as airlock up asks its in-process egressd.
type enforcementGate struct {
	client kubernetes.Interface
	ns     string
	port   int
	http   *http.Client

	mu    sync.Mutex
	hosts map[string]netip.Addr
	last  map[string]time.Time
}

func newEnforcementGate(client kubernetes.Interface, ns string, port int) *enforcementGate {
	return &enforcementGate{
		client: client, ns: ns, port: port,
		http: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
			DialContext: (&net.Dialer{Timeout: time.Second}).DialContext, MaxIdleConnsPerHost: 4}},
		hosts: map[string]netip.Addr{},
		last:  map[string]time.Time{},
	}
}

// version is the policy version the node's egressd enforces for id; ok is false when
// it does not (yet), when the pod has no node, or when the node does not answer.
func (g *enforcementGate) version(id string) (uint64, bool) {
	g.mu.Lock()
	if time.Since(g.last[id]) < gateInterval {
		g.mu.Unlock()
		return 0, false
	}
	if len(g.last) >= maxGateEntries {
		clear(g.last)
	}
	g.last[id] = time.Now()
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	base, ok := g.node(ctx, id)
	if !ok {
		return 0, false
	}
	url := base + watch.EnforcedPath + id
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := g.http.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	var e watch.Enforced
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&e) != nil || e.SandboxID != id {
		return 0, false
	}
	g.mu.Lock()
	delete(g.last, id) // enforced: later questions (policy changes) are not throttled
	g.mu.Unlock()
	return e.PolicyVersion, true
}

// node is the base URL (http://<node address>:<port>) of the egressd that serves
// sandbox id: its pod's status.hostIP, remembered once known. ok is false while the
// pod has no node address (not scheduled or not started yet) or cannot be read.
func (g *enforcementGate) node(ctx context.Context, id string) (string, bool) {
	g.mu.Lock()
	host, known := g.hosts[id]
	g.mu.Unlock()
	if !known {
		pod, err := g.client.CoreV1().Pods(g.ns).Get(ctx, kube.PodName(id), metav1.GetOptions{})
		if err != nil {
			return "", false
		}
		if host, err = netip.ParseAddr(pod.Status.HostIP); err != nil {
			return "", false
		}
		g.mu.Lock()
		if len(g.hosts) >= maxGateEntries { // deleted sandboxes' entries: start over
			clear(g.hosts)
		}
		g.hosts[id] = host
		g.mu.Unlock()
	}
	return "http://" + net.JoinHostPort(host.String(), strconv.Itoa(g.port)), true
}

func (g *enforcementGate) ready(id string) bool {
	_, ok := g.version(id)
	return ok
}

func (g *enforcementGate) policy(id string, v uint64) bool {
	got, ok := g.version(id)
	return ok && got >= v
}
