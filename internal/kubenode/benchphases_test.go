package kubenode

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/sdk"
)

// phases records when (offset from a create's start) each step of a sandbox's start
// was first seen: from a watch on its pod (scheduled, each init container finished,
// the pod's address, the sandbox container running, phase Running), from the bench's
// own calls (the create's answer, execd's first /ping, the first command) and from
// lifecycle's events of the sandbox (ContainerCreated, EgressAttached, Released, the
// Running state, ClaimedFromPool).
type phases struct {
	t0 time.Time
	mu sync.Mutex
	at map[string]time.Duration
	// claim is lifecycle's ClaimedFromPool message (its steps' durations).
	claim string
}

func newPhases(t0 time.Time) *phases { return &phases{t0: t0, at: map[string]time.Duration{}} }

// mark records name at d unless it was recorded before.
func (p *phases) mark(name string, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.at[name]; !ok {
		p.at[name] = d
	}
}

// now records name at the current time.
func (p *phases) now(name string) { p.mark(name, time.Since(p.t0)) }

// String lists the recorded steps in time order: "name=12.3ms ...".
func (p *phases) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	names := make([]string, 0, len(p.at))
	for n := range p.at {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return int(p.at[a] - p.at[b]) })
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, fmt.Sprintf("%s=%.1fms", n, float64(p.at[n].Microseconds())/1000))
	}
	if p.claim != "" {
		out = append(out, "["+p.claim+"]")
	}
	return strings.Join(out, " ")
}

// watchPod records the steps of pod name in ns seen by a watch until ctx ends or the
// pod is Running. It returns at once (the watch is made in the background, off the
// timed path); done closes when the watch ends.
func (p *phases) watchPod(ctx context.Context, cs kubernetes.Interface, ns, name string) (done <-chan struct{}) {
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
		if err != nil {
			return
		}
		defer w.Stop()
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			d := time.Since(p.t0)
			if pod.Spec.NodeName != "" {
				p.mark("pod.scheduled", d)
			}
			for _, s := range pod.Status.InitContainerStatuses {
				if s.State.Terminated != nil {
					p.mark("pod.init."+s.Name+".done", d)
				} else if s.State.Running != nil {
					p.mark("pod.init."+s.Name+".running", d)
				}
			}
			if pod.Status.PodIP != "" {
				p.mark("pod.ip", d)
			}
			for _, s := range pod.Status.ContainerStatuses {
				if s.State.Running != nil {
					p.mark("pod.container.running", d)
				}
			}
			if pod.Status.Phase == corev1.PodRunning {
				p.mark("pod.Running", d)
				return
			}
		}
	}()
	return ch
}

// lifecycleEvents records the times of sandbox id's lifecycle and network events
// (lifecycle's diagnostics: ContainerCreated, EgressAttached, Released, ClaimedFromPool,
// the Running state) as "lc.<Reason>".
func (p *phases) lifecycleEvents(ctx context.Context, c *sdk.Client, id string) {
	for _, scope := range []string{"lifecycle", "network"} {
		d, err := c.Diagnostics(ctx, id, opensandbox.DiagnosticEvents, sdk.DiagnosticOptions{Scope: scope, Delivery: "inline"})
		if err != nil {
			continue
		}
		text, err := c.DiagnosticText(ctx, d)
		if err != nil {
			continue
		}
		for l := range strings.SplitSeq(text, "\n") {
			f := strings.Fields(l)
			if len(f) < 4 {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, f[0])
			if err != nil {
				continue
			}
			p.mark("lc."+f[3], at.Sub(p.t0))
			if f[3] == "ClaimedFromPool" {
				p.mu.Lock()
				p.claim = strings.Join(f[4:], " ")
				p.mu.Unlock()
			}
		}
	}
}
