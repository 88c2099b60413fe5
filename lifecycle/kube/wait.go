package kube

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/airlockdev/airlock/lifecycle"
)

// agentSandboxPoll is how often WaitRunning asks about an agent-sandbox Sandbox's pod.
const agentSandboxPoll = 100 * time.Millisecond

// WaitRunning implements lifecycle.RunningWaiter: it returns pod name's view once the
// pod runs with an address, or once it has ended (the view, exited), at once when it
// does already. It reads the pod, then watches it from that read's resourceVersion, so
// the kubelet's status update is seen when the API server has it instead of at the next
// poll. Errors: lifecycle.ErrInstanceGone when the pod is deleted or missing, ctx's
// error when it ends first, the API server's otherwise (a watch that ends early
// included). The agent-sandbox provider asks Inspect every 100 ms instead.
func (r *Runtime) WaitRunning(ctx context.Context, name string) (lifecycle.Instance, error) {
	if r.cfg.Provider == ProviderAgentSandbox {
		for {
			in, err := r.Inspect(ctx, name)
			if err != nil || settled(in) {
				return in, err
			}
			select {
			case <-ctx.Done():
				return in, ctx.Err()
			case <-time.After(agentSandboxPoll):
			}
		}
	}
	pods := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace)
	pod, err := pods.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return lifecycle.Instance{}, fmt.Errorf("%w: pod %s", lifecycle.ErrInstanceGone, name)
	}
	if err != nil {
		return lifecycle.Instance{}, fmt.Errorf("kube: reading pod %s: %w", name, err)
	}
	in := instanceOf(pod)
	if settled(in) {
		return in, nil
	}
	w, err := pods.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion: pod.ResourceVersion,
	})
	if err != nil {
		if ctx.Err() != nil {
			return in, ctx.Err()
		}
		return in, fmt.Errorf("kube: watching pod %s: %w", name, err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return in, ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				if ctx.Err() != nil {
					return in, ctx.Err()
				}
				return in, fmt.Errorf("kube: the watch of pod %s ended", name)
			}
			switch ev.Type {
			case watch.Deleted:
				return lifecycle.Instance{}, fmt.Errorf("%w: pod %s", lifecycle.ErrInstanceGone, name)
			case watch.Error:
				return in, fmt.Errorf("kube: watching pod %s: %w", name, apierrors.FromObject(ev.Object))
			}
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			if in = instanceOf(p); settled(in) {
				return in, nil
			}
		}
	}
}

// settled: in runs with an address, or has ended.
func settled(in lifecycle.Instance) bool {
	return in.Phase == lifecycle.PhaseExited || (in.Phase == lifecycle.PhaseRunning && in.Address.IsValid())
}

var (
	_ lifecycle.RunningWaiter = (*Runtime)(nil)
)
