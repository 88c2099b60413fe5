package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/airlockdev/airlock/lifecycle"
)

// LogTailLines is the most lines Logs asks the kubelet for (the newest ones).
const LogTailLines = 20000

// podName is the pod that runs the sandbox whose ContainerID is name (agent-sandbox:
// the pod its Sandbox names).
func (r *Runtime) podName(ctx context.Context, name string) (string, error) {
	if r.cfg.Provider != ProviderAgentSandbox {
		return name, nil
	}
	sb, err := r.cfg.Dynamic.Resource(AgentSandboxGVR).Namespace(r.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", unavailable("reading the agent-sandbox Sandbox "+name, err)
	}
	return podNameOf(sb), nil
}

// unavailable wraps an API server's answer (written for users: "pod not found",
// "container is waiting to start") as lifecycle.ErrDiagnosticsUnavailable; other
// errors (the connection) stay internal.
func unavailable(what string, err error) error {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return fmt.Errorf("%w: %s: %s", lifecycle.ErrDiagnosticsUnavailable, what, st.Status().Message)
	}
	return fmt.Errorf("kube: %s: %w", what, err)
}

// Logs implements lifecycle.Diagnoser: the sandbox container's output from the
// kubelet through the API server (pods/log, timestamps on), the newest LogTailLines
// lines and at most maxBytes. A pod that is gone or has not started its container
// is an error wrapping lifecycle.ErrDiagnosticsUnavailable with the API server's
// message.
func (r *Runtime) Logs(ctx context.Context, t lifecycle.DiagnosticTarget, maxBytes int) ([]byte, bool, error) {
	pod, err := r.podName(ctx, t.ContainerID)
	if err != nil {
		return nil, false, err
	}
	tail := int64(LogTailLines)
	opts := &corev1.PodLogOptions{Container: ContainerName, Timestamps: true, TailLines: &tail}
	rc, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).GetLogs(pod, opts).Stream(ctx)
	if err != nil {
		return nil, false, unavailable("reading the logs of pod "+pod, err)
	}
	defer rc.Close()
	tb := &lifecycle.TailBuffer{Max: maxBytes}
	if _, err := io.Copy(tb, rc); err != nil {
		return nil, false, fmt.Errorf("kube: reading the logs of pod %s: %w", pod, err)
	}
	text, truncated := tb.Bytes()
	return text, truncated || tb.Lines() >= LogTailLines, nil
}

// Events implements lifecycle.Diagnoser: the Kubernetes Events about the sandbox's pod
// (and agent-sandbox Sandbox): scheduling, image pulls, container create and start,
// OOM kills, back-offs; and the pod's status: scheduled and ready (or the reason it is
// not, e.g. Unschedulable), its containers' states: started,
// waiting (with the reason, e.g. ErrImagePull), terminated with the exit code and
// reason (OOMKilled, Error), the init containers' too, and the pod's own failure
// reason. Events expire in the API server (one hour by default): what is gone is
// gone.
func (r *Runtime) Events(ctx context.Context, t lifecycle.DiagnosticTarget) ([]lifecycle.Event, []string, error) {
	name, err := r.podName(ctx, t.ContainerID)
	if err != nil {
		return nil, nil, err
	}
	var out []lifecycle.Event
	var warnings []string
	pod, err := r.cfg.Client.CoreV1().Pods(r.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		warnings = append(warnings, "pod "+name+" does not exist (any more): container states unavailable")
	case err != nil:
		return nil, nil, unavailable("reading pod "+name, err)
	default:
		out = podEvents(pod, t.Until)
	}
	names := []string{name}
	if t.ContainerID != name {
		names = append(names, t.ContainerID) // the agent-sandbox Sandbox
	}
	for _, n := range names {
		list, err := r.cfg.Client.CoreV1().Events(r.cfg.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.name", n).String(),
		})
		if err != nil {
			warnings = append(warnings, unavailable("listing the Events of "+n, err).Error())
			continue
		}
		for _, e := range list.Items {
			if e.InvolvedObject.Kind != "Pod" && e.InvolvedObject.Kind != "Sandbox" {
				continue
			}
			msg := e.Message
			if e.Count > 1 {
				msg += fmt.Sprintf(" (%d times)", e.Count)
			}
			typ := e.Type
			if typ == "" {
				typ = lifecycle.EventNormal
			}
			out = append(out, lifecycle.Event{Time: eventTime(e), Source: lifecycle.EventRuntime, Type: typ, Reason: e.Reason, Message: msg})
		}
	}
	return out, warnings, nil
}

// eventTime is when e last happened.
func eventTime(e corev1.Event) time.Time {
	var series time.Time
	if e.Series != nil {
		series = e.Series.LastObservedTime.Time
	}
	for _, t := range []time.Time{series, e.LastTimestamp.Time, e.EventTime.Time, e.FirstTimestamp.Time} {
		if !t.IsZero() {
			return t.UTC()
		}
	}
	return e.CreationTimestamp.UTC()
}

// podEvents renders the pod's status: scheduled and ready (or why not), each
// container's start, wait and termination, and the pod's own failure. A state without a time of its own (waiting) is dated
// now (or until).
func podEvents(pod *corev1.Pod, until time.Time) []lifecycle.Event {
	now := time.Now().UTC()
	if !until.IsZero() && until.Before(now) {
		now = until
	}
	var out []lifecycle.Event
	add := func(at time.Time, typ, reason, msg string) {
		if at.IsZero() {
			at = now
		}
		out = append(out, lifecycle.Event{Time: at.UTC(), Source: lifecycle.EventRuntime, Type: typ, Reason: reason, Message: msg})
	}
	for _, c := range pod.Status.Conditions {
		at := c.LastTransitionTime.Time
		switch {
		case c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue:
			add(at, lifecycle.EventNormal, "PodScheduled", "pod scheduled to node "+pod.Spec.NodeName)
		case c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue:
			add(at, lifecycle.EventNormal, "PodReady", "pod ready at "+pod.Status.PodIP)
		case (c.Type == corev1.PodScheduled || c.Type == corev1.PodReady) && c.Status == corev1.ConditionFalse && (c.Reason != "" || c.Message != ""):
			add(at, lifecycle.EventWarning, string(c.Type), strings.TrimSpace("pod not "+strings.ToLower(strings.TrimPrefix(string(c.Type), "Pod"))+": "+c.Reason+" "+c.Message))
		}
	}
	statuses := slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses)
	for _, cs := range statuses {
		what := "container " + cs.Name
		if s := cs.State.Running; s != nil {
			add(s.StartedAt.Time, lifecycle.EventNormal, "Started", what+" started")
		}
		if s := cs.State.Waiting; s != nil && s.Reason != "" {
			add(time.Time{}, lifecycle.EventWarning, "Waiting", strings.TrimSpace(what+" waiting: "+s.Reason+" "+s.Message))
		}
		if s := cs.State.Terminated; s != nil {
			add(s.StartedAt.Time, lifecycle.EventNormal, "Started", what+" started")
			typ := lifecycle.EventNormal
			if s.ExitCode != 0 || s.Reason == "OOMKilled" {
				typ = lifecycle.EventWarning
			}
			msg := fmt.Sprintf("%s exited with exit code %d", what, s.ExitCode)
			if s.Signal != 0 {
				msg += fmt.Sprintf(" (signal %d)", s.Signal)
			}
			if s.Reason != "" {
				msg += "; reason " + s.Reason
			}
			if s.Reason == "OOMKilled" {
				msg += " (OOM killed: the memory limit)"
			}
			if s.Message != "" {
				msg += ": " + s.Message
			}
			add(s.FinishedAt.Time, typ, "Exited", msg)
		}
	}
	if pod.Status.Phase == corev1.PodFailed && (pod.Status.Reason != "" || pod.Status.Message != "") {
		var at time.Time
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady && !c.LastTransitionTime.IsZero() {
				at = c.LastTransitionTime.Time
			}
		}
		add(at, lifecycle.EventWarning, "PodFailed", strings.TrimSpace("pod failed: "+pod.Status.Reason+" "+pod.Status.Message))
	}
	return out
}

var _ lifecycle.Diagnoser = (*Runtime)(nil)
