package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"

	"github.com/airlockdev/airlock/lifecycle"
)

// LogTailLines is the most lines Logs asks the engine for (the newest ones).
const LogTailLines = 20000

// Logs implements lifecycle.Diagnoser: the container's stdout and stderr from the
// engine (GET /containers/{id}/logs, timestamps on), the newest LogTailLines lines and
// at most maxBytes. A container that is gone is an error wrapping
// lifecycle.ErrDiagnosticsUnavailable.
func (r *Runtime) Logs(ctx context.Context, t lifecycle.DiagnosticTarget, maxBytes int) ([]byte, bool, error) {
	opts := client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true, Timestamps: true, Tail: strconv.Itoa(LogTailLines)}
	if !t.Until.IsZero() {
		opts.Until = unixNano(t.Until)
	}
	rc, err := r.cli.ContainerLogs(ctx, t.ContainerID, opts)
	if cerrdefs.IsNotFound(err) {
		return nil, false, fmt.Errorf("%w: the container no longer exists (its output went with it)", lifecycle.ErrDiagnosticsUnavailable)
	}
	if err != nil {
		return nil, false, fmt.Errorf("docker: reading container logs: %w", err)
	}
	defer rc.Close()
	tb := &lifecycle.TailBuffer{Max: maxBytes}
	// Sandboxes run without a TTY: the stream is multiplexed; both streams go to one
	// buffer in the engine's order.
	if _, err := stdcopy.StdCopy(tb, tb, rc); err != nil && !errors.Is(err, io.EOF) {
		return nil, false, fmt.Errorf("docker: reading container logs: %w", err)
	}
	text, truncated := tb.Bytes()
	return text, truncated || tb.Lines() >= LogTailLines, nil
}

// Events implements lifecycle.Diagnoser: the container's state from inspect (created,
// started, exited with its exit code, OOM killed, the engine's error), the engine's
// events for the container since the sandbox's creation (kill with its signal, oom,
// pause, unpause; the engine keeps only its recent events) and the pulls of the
// sandbox's image.
func (r *Runtime) Events(ctx context.Context, t lifecycle.DiagnosticTarget) ([]lifecycle.Event, []string, error) {
	res, err := r.cli.ContainerInspect(ctx, t.ContainerID, client.ContainerInspectOptions{})
	if cerrdefs.IsNotFound(err) {
		return nil, nil, fmt.Errorf("%w: the container no longer exists", lifecycle.ErrDiagnosticsUnavailable)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("docker: inspecting container: %w", err)
	}
	out := stateEvents(res.Container)
	until := t.Until
	if until.IsZero() {
		until = time.Now()
	}
	var warnings []string
	for _, f := range []client.Filters{
		client.Filters{}.Add("container", t.ContainerID),
		client.Filters{}.Add("type", string(events.ImageEventType)).Add("event", string(events.ActionPull)),
	} {
		msgs, err := r.engineEvents(ctx, t.Since.Add(-time.Second), until, f)
		if err != nil {
			r.log.Warn("reading engine events failed", "container_id", t.ContainerID, "err", err)
			warnings = append(warnings, "the engine's event log could not be read; container state only")
			break
		}
		for _, m := range msgs {
			if e, ok := engineEvent(m, t.Image); ok {
				out = append(out, e)
			}
		}
	}
	return out, warnings, nil
}

// engineEvents reads the engine's events from since to until matching f.
func (r *Runtime) engineEvents(ctx context.Context, since, until time.Time, f client.Filters) ([]events.Message, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res := r.cli.Events(ctx, client.EventsListOptions{Since: unixNano(since), Until: unixNano(until), Filters: f})
	var out []events.Message
	for {
		select {
		case m := <-res.Messages:
			out = append(out, m)
		case err := <-res.Err:
			if err == nil || errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
	}
}

// engineEvent maps an engine event worth showing; image is the sandbox's image (pulls
// of other images are not its).
func engineEvent(m events.Message, image string) (lifecycle.Event, bool) {
	at := time.Unix(0, m.TimeNano).UTC()
	if m.TimeNano == 0 {
		at = time.Unix(m.Time, 0).UTC()
	}
	e := lifecycle.Event{Time: at, Source: lifecycle.EventRuntime, Type: lifecycle.EventNormal}
	switch {
	case m.Type == events.ImageEventType && m.Action == events.ActionPull:
		if !sameImage(m.Actor.ID, image) && !sameImage(m.Actor.Attributes["name"], image) {
			return e, false
		}
		e.Reason, e.Message = "Pulled", "image "+m.Actor.ID+" pulled"
	case m.Type != events.ContainerEventType:
		return e, false
	case m.Action == events.ActionKill:
		e.Reason, e.Message = "Killed", "the engine sent signal "+m.Actor.Attributes["signal"]
	case m.Action == events.ActionOOM:
		e.Type, e.Reason, e.Message = lifecycle.EventWarning, "OOMKilling", "a process of the container was killed: out of memory (the memory limit)"
	case m.Action == events.ActionPause:
		e.Reason, e.Message = "Paused", "the container's processes were frozen"
	case m.Action == events.ActionUnPause:
		e.Reason, e.Message = "Unpaused", "the container's processes were thawed"
	default:
		// create, start and die come from the container's state (always there, not
		// only while the engine remembers them).
		return e, false
	}
	return e, true
}

func sameImage(a, b string) bool {
	norm := func(s string) string {
		if s != "" && !strings.Contains(s[strings.LastIndex(s, "/")+1:], ":") && !strings.Contains(s, "@") {
			s += ":latest"
		}
		return s
	}
	return a != "" && norm(a) == norm(b)
}

// stateEvents renders the container's state as events: created, started, and exited
// (exit code, OOM kill, the engine's error) when it is not running.
func stateEvents(c container.InspectResponse) []lifecycle.Event {
	var out []lifecycle.Event
	ev := func(ts, typ, reason, msg string) {
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil || at.Year() <= 1 {
			return
		}
		out = append(out, lifecycle.Event{Time: at.UTC(), Source: lifecycle.EventRuntime, Type: typ, Reason: reason, Message: msg})
	}
	img := ""
	if c.Config != nil {
		img = " from image " + c.Config.Image
	}
	ev(c.Created, lifecycle.EventNormal, "ContainerCreated", "container "+short(c.ID)+" created"+img)
	st := c.State
	if st == nil {
		return out
	}
	ev(st.StartedAt, lifecycle.EventNormal, "Started", fmt.Sprintf("container started (pid %d on the host while it runs)", st.Pid))
	if st.Running || st.Paused || st.Restarting || st.Status == container.StateCreated {
		return out
	}
	typ, msg := lifecycle.EventNormal, fmt.Sprintf("container exited with exit code %d", st.ExitCode)
	if st.ExitCode != 0 {
		typ = lifecycle.EventWarning
	}
	if st.OOMKilled {
		typ = lifecycle.EventWarning
		msg += "; OOM killed"
		if c.HostConfig != nil && c.HostConfig.Memory > 0 {
			msg += fmt.Sprintf(" (memory limit %d bytes)", c.HostConfig.Memory)
		}
	}
	if st.Error != "" {
		typ, msg = lifecycle.EventWarning, msg+"; engine error: "+st.Error
	}
	ev(st.FinishedAt, typ, "Exited", msg)
	return out
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func unixNano(t time.Time) string {
	return fmt.Sprintf("%d.%09d", t.Unix(), t.Nanosecond())
}

var _ lifecycle.Diagnoser = (*Runtime)(nil)
