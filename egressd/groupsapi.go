package egressd

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlockdev/airlock/audit/execdaudit"
	"github.com/airlockdev/airlock/internal/cgroupv2"
	"github.com/airlockdev/airlock/opensandbox"
)

// GroupsHandler serves the process group node API (execdaudit.GroupsPath) to callers
// that send apiKey in opensandbox.HeaderAPIKey (401 otherwise; the gateway replicas
// hold the same key): the gateway on Kubernetes, which proxies execd without a view of
// the node's /proc, has this node's egressd watch for each command's process group
// (execdaudit.WatchGroups, the same code `airlock up` runs in its proxies), so the
// command's record names the group flow records name (extra.execution.pgid). The
// watch starts at egressd's own CLOCK_BOOTTIME minus execdaudit.GroupsSlack; the
// sandbox's init is Runtime.Pid when the watch says it, else the process of the pod's
// cgroup (Runtime.PodUID under Config.CgroupRoot) that is 1 in a pid namespace of
// its own and named execd. It needs the node's pid namespace (hostPID): reading
// another process's task/*/children, stat and status takes no capability.
//
// Answers are execdaudit.GroupsPath's: 201, 200, 400, 404, 429, 503 (JSON errors).
func (d *Daemon) GroupsHandler(apiKey string) http.Handler {
	g := &groupWatches{d: d, m: map[string]*groupEntry{}, per: map[string]int{}, inits: map[string]podInitEntry{}}
	mux := http.NewServeMux()
	auth := func(h http.HandlerFunc) http.HandlerFunc { return requireAPIKey(apiKey, h) }
	mux.HandleFunc("POST "+execdaudit.GroupsPath+"{id}", auth(g.start))
	mux.HandleFunc("POST "+execdaudit.GroupsPath+"{id}/{watch}/end", auth(g.end))
	return mux
}

// groupWatches are the open watches: by watch id, and their count per sandbox; and
// the pods' inits found so far, by pod UID.
type groupWatches struct {
	d     *Daemon
	mu    sync.Mutex
	m     map[string]*groupEntry
	per   map[string]int
	inits map[string]podInitEntry
}

// podInitEntry is a pod's init as podInit found it: its pid and start time (clock
// ticks since boot), which tell whether the pid is still that process.
type podInitEntry struct {
	pid   int
	start time.Duration
}

// maxPodInits bounds groupWatches.inits: past it the cache starts again (a node runs
// far fewer pods).
const maxPodInits = 4096

// podInit is podInit for pod uid under the node's cgroup root, remembered: a pod's
// init is found once (a walk of the pod's cgroups and a few /proc reads per process)
// and then only checked to be the same process (one /proc read) for each command.
func (g *groupWatches) podInit(uid string) (int, error) {
	g.mu.Lock()
	c, ok := g.inits[uid]
	g.mu.Unlock()
	if ok && c.start >= 0 && procStart(procRoot+"/"+strconv.Itoa(c.pid)) == c.start {
		return c.pid, nil
	}
	pid, err := podInit(g.d.cfg.CgroupRoot, uid)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		delete(g.inits, uid)
		return 0, err
	}
	if len(g.inits) >= maxPodInits {
		clear(g.inits)
	}
	g.inits[uid] = podInitEntry{pid: pid, start: procStart(procRoot + "/" + strconv.Itoa(pid))}
	return pid, nil
}

type groupEntry struct {
	sandbox string
	w       execdaudit.GroupWatch
	expire  *time.Timer
}

func (g *groupWatches) start(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	g.d.mu.RLock()
	sb := g.d.byID[id]
	var rtPid int
	var podUID, kind string
	if sb != nil {
		rtPid, podUID, kind = sb.view.Runtime.Pid, sb.view.Runtime.PodUID, sb.view.Runtime.Kind
	}
	g.d.mu.RUnlock()
	if sb == nil {
		opensandbox.WriteError(w, http.StatusNotFound, opensandbox.ErrorBody{Code: "NOT_FOUND", Message: "this node does not run sandbox " + id})
		return
	}
	since := execdaudit.BootNow() - execdaudit.GroupsSlack
	init := rtPid
	if init <= 0 && kind == RuntimeKubernetes && podUID != "" {
		var err error
		if init, err = g.podInit(podUID); err != nil {
			opensandbox.WriteError(w, http.StatusServiceUnavailable, opensandbox.ErrorBody{Code: "UNAVAILABLE", Message: err.Error()})
			return
		}
	}
	if init <= 0 {
		opensandbox.WriteError(w, http.StatusServiceUnavailable, opensandbox.ErrorBody{Code: "UNAVAILABLE", Message: "sandbox " + id + " has no known init process"})
		return
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	wid := hex.EncodeToString(b[:])
	g.mu.Lock()
	if g.per[id] >= execdaudit.GroupsPerSandbox {
		g.mu.Unlock()
		opensandbox.WriteError(w, http.StatusTooManyRequests, opensandbox.ErrorBody{Code: "TOO_MANY_REQUESTS",
			Message: strconv.Itoa(execdaudit.GroupsPerSandbox) + " process group watches of sandbox " + id + " are open"})
		return
	}
	e := &groupEntry{sandbox: id, w: execdaudit.WatchGroups(init, since)}
	g.m[wid] = e
	g.per[id]++
	// A watch nobody ends (a gateway gone mid-command) goes by itself.
	e.expire = time.AfterFunc(execdaudit.WatchMax+time.Minute, func() {
		if g.take(wid) != nil {
			e.w.End(false)
		}
	})
	g.mu.Unlock()
	opensandbox.WriteJSON(w, http.StatusCreated, execdaudit.GroupsStarted{ID: wid})
}

// take removes watch wid (nil when unknown).
func (g *groupWatches) take(wid string) *groupEntry {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.m[wid]
	if e == nil {
		return nil
	}
	delete(g.m, wid)
	if g.per[e.sandbox]--; g.per[e.sandbox] <= 0 {
		delete(g.per, e.sandbox)
	}
	return e
}

func (g *groupWatches) end(w http.ResponseWriter, r *http.Request) {
	var req execdaudit.GroupsEnd
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		opensandbox.WriteError(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: "INVALID_REQUEST", Message: "body: " + err.Error()})
		return
	}
	g.mu.Lock()
	e := g.m[r.PathValue("watch")]
	g.mu.Unlock()
	if e == nil || e.sandbox != r.PathValue("id") {
		opensandbox.WriteError(w, http.StatusNotFound, opensandbox.ErrorBody{Code: "NOT_FOUND", Message: "no open process group watch " + r.PathValue("watch")})
		return
	}
	if g.take(r.PathValue("watch")) == nil { // ended meanwhile
		opensandbox.WriteError(w, http.StatusNotFound, opensandbox.ErrorBody{Code: "NOT_FOUND", Message: "no open process group watch " + r.PathValue("watch")})
		return
	}
	e.expire.Stop()
	groups, ambi := e.w.End(req.Take)
	if groups == nil {
		groups = []execdaudit.ProcGroup{}
	}
	opensandbox.WriteJSON(w, http.StatusOK, execdaudit.GroupsEnded{Groups: groups, Ambiguous: ambi})
}

// errNoPodInit means no process of the pod's cgroup is execd as its pid namespace's 1.
var errNoPodInit = errors.New("egressd: no execd init among the pod's processes (is egressd in the node's pid namespace?)")

// podInit returns the host pid of the pod's init (execd): a process of a container
// cgroup under the pod's (cgroupv2.OfPod(root, uid)) whose /proc status says it is 1
// in a pid namespace below egressd's and whose comm is execd (the pause container's is
// pause). Errors: OfPod's, errNoPodInit.
func podInit(root, uid string) (int, error) {
	dir, err := cgroupv2.OfPod(root, uid)
	if err != nil {
		return 0, err
	}
	found := 0
	_ = filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || found > 0 {
			return filepath.SkipDir
		}
		if !de.IsDir() {
			return nil
		}
		if strings.Count(strings.TrimPrefix(p, dir), "/") > 2 {
			return filepath.SkipDir
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(f)
			if pid > 0 && isNSInit(pid, "execd") {
				found = pid
				return filepath.SkipAll
			}
		}
		return nil
	})
	if found == 0 {
		return 0, errNoPodInit
	}
	return found, nil
}

// isNSInit reports whether pid (in procRoot) is named comm and is 1 in a pid
// namespace below this one (NSpid: <pid here> ... 1).
func isNSInit(pid int, comm string) bool {
	dir := procRoot + "/" + strconv.Itoa(pid)
	c, err := os.ReadFile(dir + "/comm")
	if err != nil || strings.TrimSpace(string(c)) != comm {
		return false
	}
	b, err := os.ReadFile(dir + "/status")
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			return len(f) > 1 && f[len(f)-1] == "1"
		}
	}
	return false
}
