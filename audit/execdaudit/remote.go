package execdaudit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
)

// The process group node API (egressd.GroupsHandler, on egressd's --metrics-listen
// behind the API key in opensandbox.HeaderAPIKey): where the proxy of execd has no
// view of the sandbox's /proc (the gateway on Kubernetes), the sandbox's node's
// egressd watches for it.
//
//   - POST GroupsPath+"<sandbox id>" (no body) starts a watch from egressd's own
//     CLOCK_BOOTTIME minus GroupsSlack: 201 with GroupsStarted; 404 when the node does
//     not run the sandbox; 503 when the sandbox's init (execd) is not found in its
//     pod's cgroup; 429 when GroupsPerSandbox watches of it are open.
//   - POST GroupsPath+"<sandbox id>/<watch id>/end" with GroupsEnd: 200 with
//     GroupsEnded (GroupWatch.End); 404 for an unknown or expired watch (a watch ends
//     by itself WatchMax after it started); 400 for a body that is not GroupsEnd.
const GroupsPath = "/v1/groups/"

// GroupsSlack is how much earlier than egressd's receipt of the start a group may
// have started: the command may reach execd before the start reaches egressd.
const GroupsSlack = 200 * time.Millisecond

// GroupsPerSandbox bounds the watches open at once for one sandbox.
const GroupsPerSandbox = 64

// GroupsStarted answers a start: ID names the watch (32 hex digits).
type GroupsStarted struct {
	ID string `json:"id"`
}

// GroupsEnd is the body of an end: Take as in GroupWatch.End.
type GroupsEnd struct {
	Take bool `json:"take"`
}

// GroupsEnded answers an end: GroupWatch.End's groups (host and sandbox pgid) and
// ambiguous.
type GroupsEnded struct {
	Groups    []ProcGroup `json:"groups"`
	Ambiguous bool        `json:"ambiguous,omitempty"`
}

// Bounds of RemoteGroups' calls.
const (
	// remoteStartWait is the most a command waits for its watch to start: egressd
	// answers within a millisecond; a slower or failed start leaves the command
	// without a group, never later.
	remoteStartWait = 50 * time.Millisecond
	// remoteTimeout bounds each call (a start still in flight after remoteStartWait
	// is used when it answers in time for the end).
	remoteTimeout = 2 * time.Second
	// remoteBackoff is how long a node whose egressd failed is not asked.
	remoteBackoff = 10 * time.Second
	// remoteKeep bounds the sandboxes and nodes remembered for logs and backoff.
	remoteKeep = 4096
)

// RemoteGroups starts GroupWatches through the egressd of a sandbox's node (the
// GroupsPath API). Failures leave commands without a group: each is logged once per
// sandbox (key "err"), and a node that failed is not asked for remoteBackoff. Safe for
// concurrent use; the zero value is not: use NewRemoteGroups.
type RemoteGroups struct {
	port   int
	apiKey string
	http   *http.Client
	log    *slog.Logger

	mu     sync.Mutex
	logged map[string]bool      // sandbox ids whose failure was logged
	down   map[string]time.Time // egressd base URL -> not asked until
}

// NewRemoteGroups returns a RemoteGroups asking egressd on port of each node with
// apiKey; log nil discards.
func NewRemoteGroups(port int, apiKey string, log *slog.Logger) *RemoteGroups {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &RemoteGroups{port: port, apiKey: apiKey, log: log, http: &http.Client{Timeout: remoteTimeout},
		logged: map[string]bool{}, down: map[string]time.Time{}}
}

// For returns, for Info.Groups, the look for a command of sandbox id on the egressd of
// node (the pod's status.hostIP): nil, no look, for a nil RemoteGroups or an unknown
// node.
func (r *RemoteGroups) For(node, id string) func() GroupWatch {
	if r == nil || node == "" {
		return nil
	}
	return func() GroupWatch { return r.Watch(node, id) }
}

// Watch starts a watch of sandbox id's command on the egressd of node (the pod's
// status.hostIP); it waits at most remoteStartWait. Nil when node is empty or its
// egressd failed lately.
func (r *RemoteGroups) Watch(node, id string) GroupWatch {
	if r == nil || node == "" || id == "" {
		return nil
	}
	base := "http://" + net.JoinHostPort(node, strconv.Itoa(r.port))
	r.mu.Lock()
	until, down := r.down[base]
	r.mu.Unlock()
	if down && time.Now().Before(until) {
		return nil
	}
	w := &remoteWatch{r: r, base: base, sandbox: id, started: make(chan struct{})}
	go w.start()
	t := time.NewTimer(remoteStartWait)
	defer t.Stop()
	select {
	case <-w.started:
	case <-t.C:
	}
	return w
}

// fail logs err once for sandbox id and sets base's backoff when node is set.
func (r *RemoteGroups) fail(base, id string, err error, nodeDown bool) {
	r.mu.Lock()
	if len(r.logged) >= remoteKeep {
		clear(r.logged)
	}
	if len(r.down) >= remoteKeep {
		clear(r.down)
	}
	first := !r.logged[id]
	r.logged[id] = true
	if nodeDown {
		r.down[base] = time.Now().Add(remoteBackoff)
	}
	r.mu.Unlock()
	if first {
		r.log.Warn("the node's egressd did not watch a command's process group; its record names none",
			"sandbox_id", id, "egressd", base, "err", err)
	}
}

// call POSTs body (nil: none) to path and decodes a 2xx answer into out.
func (r *RemoteGroups) call(path string, body, out any) (int, error) {
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), remoteTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(opensandbox.HeaderAPIKey, r.apiKey)
	resp, err := r.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var e opensandbox.ErrorBody
		_ = json.NewDecoder(io.LimitReader(resp.Body, 4<<10)).Decode(&e)
		return resp.StatusCode, &remoteError{status: resp.StatusCode, msg: e.Message}
	}
	return resp.StatusCode, json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(out)
}

type remoteError struct {
	status int
	msg    string
}

func (e *remoteError) Error() string {
	return "egressd answered " + strconv.Itoa(e.status) + ": " + e.msg
}

// remoteWatch is one watch on a node's egressd: start sets id (empty on failure) and
// closes started.
type remoteWatch struct {
	r       *RemoteGroups
	base    string
	sandbox string
	started chan struct{}
	id      string
	once    sync.Once
}

func (w *remoteWatch) start() {
	defer close(w.started)
	var res GroupsStarted
	status, err := w.r.call(w.base+GroupsPath+w.sandbox, nil, &res)
	if err == nil && res.ID == "" {
		err = &remoteError{status: status, msg: "no watch id"}
	}
	if err != nil {
		// No answer, a refused key or a 404 without the API's error body (an egressd
		// without this API) is the node's, not the sandbox's: back off.
		var re *remoteError
		nodeDown := status == 0 || status == http.StatusUnauthorized ||
			status == http.StatusNotFound && errors.As(err, &re) && re.msg == ""
		w.r.fail(w.base, w.sandbox, err, nodeDown)
		return
	}
	w.id = res.ID
}

// End implements GroupWatch: it waits for the start (at most remoteTimeout), then asks
// egressd to end the watch. Without take the end is sent on a goroutine of its own
// and End returns at once.
func (w *remoteWatch) End(take bool) ([]ProcGroup, bool) {
	var groups []ProcGroup
	var ambi bool
	end := func() {
		<-w.started
		if w.id == "" {
			return
		}
		var res GroupsEnded
		if _, err := w.r.call(w.base+GroupsPath+w.sandbox+"/"+w.id+"/end", GroupsEnd{Take: take}, &res); err != nil {
			w.r.fail(w.base, w.sandbox, err, false)
			return
		}
		groups, ambi = res.Groups, res.Ambiguous
	}
	first := false
	w.once.Do(func() { first = true })
	switch {
	case !first:
		return nil, false
	case !take:
		go end()
		return nil, false
	}
	end()
	return groups, ambi
}
