package kube_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/lifecycle/kube"
)

// TestDiagnostics plays the kubelet and the scheduler on the real API server: the
// pod's Events and its container's exit (code 3) come back as runtime events, Events
// of other pods do not; logs, which need a kubelet serving them, answer a warning
// written for users.
func TestDiagnostics(t *testing.T) {
	w := newWorld(t)
	rt := w.runtime(t, nil)
	ctx := t.Context()
	for _, id := range []string{"d1", "d2"} {
		if _, err := rt.Create(ctx, lifecycle.Spec{SandboxID: id, Image: "debian:12", Entrypoint: []string{"sh", "-c", "exit 3"}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.env.SetPodRunning(ctx, w.ns, "sbx-d1", "node-a", "10.244.1.11"); err != nil {
		t.Fatal(err)
	}
	started := metav1.NewTime(time.Now().Add(-2 * time.Second).Truncate(time.Second))
	finished := metav1.NewTime(time.Now().Truncate(time.Second))
	pods := w.env.Client.CoreV1().Pods(w.ns)
	pod, err := pods.Get(ctx, "sbx-d1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodFailed
	pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: kube.InitContainerName, State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: started, FinishedAt: started}}}}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: kube.ContainerName, State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: 3, Reason: "Error", StartedAt: started, FinishedAt: finished}}}}
	if _, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	event := func(name, pod, typ, reason, msg string, count int32) {
		t.Helper()
		_, err := w.env.Client.CoreV1().Events(w.ns).Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: name, Namespace: w.ns},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: w.ns, Name: pod, APIVersion: "v1"},
			Type:           typ, Reason: reason, Message: msg, Count: count,
			FirstTimestamp: started, LastTimestamp: started,
			Source: corev1.EventSource{Component: "kubelet", Host: "node-a"},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	event("e1", "sbx-d1", "Normal", "Scheduled", "Successfully assigned sandbox pod to node-a", 1)
	event("e2", "sbx-d1", "Normal", "Pulled", "Container image \"debian:12\" already present on machine", 2)
	event("e3", "sbx-d2", "Warning", "Failed", "not this sandbox's", 1)

	evs, warnings, err := rt.Events(ctx, lifecycle.DiagnosticTarget{SandboxID: "d1", ContainerID: "sbx-d1"})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, e := range evs {
		if e.Source != lifecycle.EventRuntime || e.Time.IsZero() {
			t.Errorf("event %+v", e)
		}
		lines = append(lines, e.Type+" "+e.Reason+" "+e.Message)
	}
	all := strings.Join(lines, "\n")
	for _, want := range []string{
		"Normal Scheduled Successfully assigned sandbox pod to node-a",
		"Normal Pulled Container image \"debian:12\" already present on machine (2 times)",
		"Normal Exited container execd exited with exit code 0; reason Completed",
		"Warning Exited container sandbox exited with exit code 3; reason Error",
		"Normal PodScheduled pod scheduled to node node-a",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("events lack %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "not this sandbox's") {
		t.Errorf("another pod's Event came back:\n%s", all)
	}
	if len(warnings) != 0 {
		t.Errorf("warnings %q", warnings)
	}

	// No kubelet serves logs here: a warning written for users, not an internal error.
	_, _, err = rt.Logs(ctx, lifecycle.DiagnosticTarget{SandboxID: "d1", ContainerID: "sbx-d1"}, 1<<20)
	if !errors.Is(err, lifecycle.ErrDiagnosticsUnavailable) {
		t.Errorf("logs without a kubelet: %v, want ErrDiagnosticsUnavailable", err)
	}

	// A pod that is gone: its Events may outlive it; the states are a warning.
	if err := rt.Remove(ctx, lifecycle.Instance{SandboxID: "d2", ContainerID: "sbx-d2"}); err != nil {
		t.Fatal(err)
	}
	evs, warnings, err = rt.Events(ctx, lifecycle.DiagnosticTarget{SandboxID: "d2", ContainerID: "sbx-d2"})
	if err != nil || len(evs) != 1 || evs[0].Reason != "Failed" || len(warnings) != 1 || !strings.Contains(warnings[0], "does not exist") {
		t.Errorf("gone pod: events %+v, warnings %q, err %v", evs, warnings, err)
	}
}
