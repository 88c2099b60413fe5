package execd

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
)

// Config configures a Server. The zero value serves on :44772 (opensandbox.ExecdPort)
// without a token.
type Config struct {
	// Addr is the listen address, ":44772" when empty.
	Addr string
	// AccessToken, when set, must arrive in X-EXECD-ACCESS-TOKEN
	// (opensandbox.HeaderExecdAccessToken) on every request except GET /ping (liveness
	// stays open); the hold's release (opensandbox.ReleasePath) needs it too.
	AccessToken string
	// AccessTokenSHA256, when AccessToken is empty and this is set, is the SHA-256 of
	// the token that must arrive as AccessToken would (32 bytes): the token itself never
	// reaches the sandbox (the Kubernetes runtime's pods without an init container pass
	// only this digest on execd's command line). Any other length is an error of New.
	AccessTokenSHA256 []byte
	// Workdir is the working directory of commands, sessions and kernels that ask for
	// none, and the base of relative paths. Default: /workspace when it exists, else /.
	Workdir string
	// StateDir holds background command logs and kernel connection files. Default: a
	// fresh directory under os.TempDir(), removed by Close.
	StateDir string
	// KernelDirs are the Jupyter kernelspec directories searched for code contexts
	// (each holds <name>/kernel.json). Default: the standard Jupyter data paths.
	KernelDirs []string
	// Logger receives the server's logs; slog.Default() when nil.
	Logger *slog.Logger
	// Procs tracks the processes execd starts (shared with Supervise in PID 1 mode).
	// A fresh tracker when nil.
	Procs *Procs
	// MaxPTYSessions bounds the PTY sessions that exist at once (created by POST /pty
	// and not yet deleted, whether their shell runs or exited: each keeps its replay
	// buffer, PTYReplayBytes). A POST /pty past it answers 409 PTY_LIMIT_EXCEEDED.
	// 0 means DefaultMaxPTYSessions; negative, no limit.
	MaxPTYSessions int
	// Hold, when set, refuses every request but GET /ping with 503 STARTING until it
	// is released through POST opensandbox.ReleasePath (see Hold). Nil: no hold.
	Hold *Hold
}

// Server is the execd HTTP API.
type Server struct {
	cfg      Config
	log      *slog.Logger
	procs    *Procs
	shell    string // bash or sh, "" when the image has neither
	stateDir string
	ownState bool
	handler  http.Handler

	cmds     *commands
	sessions *sessions
	code     *codeContexts
	ptys     *ptySessions
	metrics  *metricsSampler

	closeOnce sync.Once
}

// New checks cfg, fills in defaults and returns a Server ready to serve.
func New(cfg Config) (*Server, error) {
	if n := len(cfg.AccessTokenSHA256); n != 0 && n != sha256.Size {
		return nil, fmt.Errorf("execd: the access token's SHA-256 has %d bytes, want %d", n, sha256.Size)
	}
	if cfg.Addr == "" {
		cfg.Addr = net.JoinHostPort("", strconv.Itoa(opensandbox.ExecdPort))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Procs == nil {
		cfg.Procs = &Procs{}
	}
	if cfg.Workdir == "" {
		cfg.Workdir = "/"
		if fi, err := os.Stat("/workspace"); err == nil && fi.IsDir() {
			cfg.Workdir = "/workspace"
		}
	}
	if !filepath.IsAbs(cfg.Workdir) {
		return nil, fmt.Errorf("execd: workdir %q is not absolute", cfg.Workdir)
	}
	if fi, err := os.Stat(cfg.Workdir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("execd: workdir %q is not a directory", cfg.Workdir)
	}
	if len(cfg.KernelDirs) == 0 {
		cfg.KernelDirs = defaultKernelDirs()
	}
	s := &Server{cfg: cfg, log: cfg.Logger, procs: cfg.Procs}
	s.stateDir = cfg.StateDir
	if s.stateDir == "" {
		d, err := os.MkdirTemp("", "execd-")
		if err != nil {
			return nil, fmt.Errorf("execd: state dir: %w", err)
		}
		s.stateDir, s.ownState = d, true
	} else if err := os.MkdirAll(s.stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("execd: state dir: %w", err)
	}
	for _, sh := range []string{"bash", "sh"} {
		if p, err := exec.LookPath(sh); err == nil {
			s.shell = p
			break
		}
	}
	s.cmds = newCommands(s)
	s.sessions = newSessions(s)
	s.code = newCodeContexts(s)
	s.ptys = &ptySessions{byID: map[string]*ptySession{}, max: cfg.MaxPTYSessions}
	if s.ptys.max == 0 {
		s.ptys.max = DefaultMaxPTYSessions
	}
	s.metrics = newMetricsSampler()
	s.handler = s.routes()
	return s, nil
}

// Handler returns the API's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Run serves the API on cfg.Addr until ctx ends, then stops the server and everything
// it started (Close). It returns the listen error, if any.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("execd: listen: %w", err)
	}
	return s.Serve(ctx, ln)
}

// Serve is Run on an open listener.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 30 * time.Second}
	s.log.Info("execd serving", "addr", ln.Addr().String(), "workdir", s.cfg.Workdir,
		"shell", s.shell, "token", s.cfg.AccessToken != "" || len(s.cfg.AccessTokenSHA256) > 0)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		s.Close()
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	srv.Shutdown(shutdown)
	srv.Close()
	s.Close()
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Close ends every command, session, PTY session and code context the server started and removes
// its own state directory. It is safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.cmds.close()
		s.sessions.close()
		s.code.close()
		s.ptys.close()
		if s.ownState {
			os.RemoveAll(s.stateDir)
		}
	})
	return nil
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ping", func(w http.ResponseWriter, r *http.Request) { writeEmpty(w) })
	mux.HandleFunc("GET /metrics", s.handleMetrics)
	mux.HandleFunc("GET /metrics/watch", s.handleMetricsWatch)

	mux.HandleFunc("POST /command", s.handleRunCommand)
	mux.HandleFunc("DELETE /command", s.handleInterruptCommand)
	// GET /command/status/{id} and GET /command/{id}/logs overlap as mux patterns.
	mux.HandleFunc("GET /command/{a}/{b}", func(w http.ResponseWriter, r *http.Request) {
		switch a, b := r.PathValue("a"), r.PathValue("b"); {
		case a == "status":
			s.handleCommandStatus(w, r, b)
		case b == "logs":
			s.handleCommandLogs(w, r, a)
		default:
			writeError(w, errorf(ErrNotFound, "no route for %s %s", r.Method, r.URL.Path))
		}
	})

	mux.HandleFunc("POST /session", s.handleCreateSession)
	mux.HandleFunc("POST /session/{id}/run", s.handleRunInSession)
	mux.HandleFunc("DELETE /session/{id}", s.handleDeleteSession)

	mux.HandleFunc("POST /pty", s.handleCreatePTY)
	mux.HandleFunc("GET /pty/{id}", s.handleGetPTY)
	mux.HandleFunc("DELETE /pty/{id}", s.handleDeletePTY)
	mux.HandleFunc("GET /pty/{id}/ws", s.handlePTYSocket)

	mux.HandleFunc("GET /files/info", s.handleFilesInfo)
	mux.HandleFunc("DELETE /files", s.handleDeleteFiles)
	mux.HandleFunc("POST /files/permissions", s.handlePermissions)
	mux.HandleFunc("POST /files/mv", s.handleMove)
	mux.HandleFunc("GET /files/search", s.handleSearch)
	mux.HandleFunc("POST /files/replace", s.handleReplace)
	mux.HandleFunc("POST /files/upload", s.handleUpload)
	mux.HandleFunc("GET /files/download", s.handleDownload)

	mux.HandleFunc("GET /directories/list", s.handleListDirectory)
	mux.HandleFunc("POST /directories", s.handleMakeDirs)
	mux.HandleFunc("DELETE /directories", s.handleDeleteDirs)

	mux.HandleFunc("POST /code/context", s.handleCreateContext)
	mux.HandleFunc("GET /code/contexts", s.handleListContexts)
	mux.HandleFunc("DELETE /code/contexts", s.handleDeleteContexts)
	mux.HandleFunc("GET /code/contexts/{id}", s.handleGetContext)
	mux.HandleFunc("DELETE /code/contexts/{id}", s.handleDeleteContext)
	mux.HandleFunc("POST /code", s.handleRunCode)
	mux.HandleFunc("DELETE /code", s.handleInterruptCode)

	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errorf(ErrNotFound, "no route for %s %s", r.Method, r.URL.Path))
	})
	if s.cfg.Hold != nil {
		return s.middleware(holdMiddleware(s.cfg.Hold, mux))
	}
	return s.middleware(mux)
}

// middleware checks the access token and turns handler panics into JSON 500 answers.
func (s *Server) middleware(next http.Handler) http.Handler {
	token := []byte(s.cfg.AccessToken)
	digest := s.cfg.AccessTokenSHA256
	if len(token) > 0 {
		digest = nil
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("handler panic", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v))
				writeError(w, errors.New("internal error"))
			}
		}()
		if (len(token) > 0 || len(digest) > 0) && !(r.Method == http.MethodGet && r.URL.Path == "/ping") {
			got := []byte(r.Header.Get(opensandbox.HeaderExecdAccessToken))
			ok := false
			if len(token) > 0 {
				ok = subtle.ConstantTimeCompare(got, token) == 1
			} else {
				sum := sha256.Sum256(got)
				ok = len(got) > 0 && subtle.ConstantTimeCompare(sum[:], digest) == 1
			}
			if !ok {
				writeError(w, errorf(ErrUnauthorized, "missing or wrong X-EXECD-ACCESS-TOKEN header"))
				return
			}
		}
		s.log.Debug("request", "method", r.Method, "path", r.URL.Path)
		next.ServeHTTP(w, r)
	})
}

// newID returns a random 32-hex-digit identifier.
func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
