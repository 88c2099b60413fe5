package jupyter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Errors of a kernel.
var (
	// ErrDead is an operation on a kernel whose process has exited.
	ErrDead = errors.New("jupyter: the kernel has exited")
	// ErrNotReady is a kernel that did not answer kernel_info in time.
	ErrNotReady = errors.New("jupyter: the kernel did not become ready")
)

// Spec is a kernelspec (kernel.json).
type Spec struct {
	Argv          []string          `json:"argv"`
	DisplayName   string            `json:"display_name"`
	Language      string            `json:"language"`
	InterruptMode string            `json:"interrupt_mode,omitempty"` // "signal" (default) or "message"
	Env           map[string]string `json:"env,omitempty"`
	// Name is the kernelspec's directory name (python3, ...); Dir is that directory.
	Name string `json:"-"`
	Dir  string `json:"-"`
}

// FindSpecs reads <dir>/<name>/kernel.json in every dir; the first dir holding a name wins.
// Unreadable specs are skipped.
func FindSpecs(dirs []string) []Spec {
	seen := map[string]bool{}
	var out []Spec
	for _, d := range dirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if seen[e.Name()] {
				continue
			}
			b, err := os.ReadFile(filepath.Join(d, e.Name(), "kernel.json"))
			if err != nil {
				continue
			}
			var s Spec
			if json.Unmarshal(b, &s) != nil || len(s.Argv) == 0 {
				continue
			}
			s.Name, s.Dir = e.Name(), filepath.Join(d, e.Name())
			seen[e.Name()] = true
			out = append(out, s)
		}
	}
	return out
}

// Config starts a kernel.
type Config struct {
	Spec Spec
	// Dir is the kernel's working directory; Env its environment (os.Environ() when nil).
	Dir string
	Env []string
	// StateDir receives the connection file.
	StateDir string
	// Start and Wait start and wait for the kernel process (execd's process tracker);
	// cmd.Start and cmd.Wait when nil.
	Start func(*exec.Cmd) error
	Wait  func(*exec.Cmd) error
	// ReadyTimeout bounds the wait for the first kernel_info_reply; 60 s when zero.
	ReadyTimeout time.Duration
	Logger       *slog.Logger
}

// Kernel is a running kernel with its shell, control and iopub connections.
type Kernel struct {
	spec     Spec
	cmd      *exec.Cmd
	connFile string
	codec    Codec
	session  string
	log      *slog.Logger

	ctx     context.Context
	cancel  context.CancelFunc
	shell   zmq4.Socket
	control zmq4.Socket
	iopub   zmq4.Socket
	sendMu  sync.Mutex
	dead    chan struct{}

	mu      sync.Mutex
	waiters map[string]chan Message // parent msg_id -> iopub and shell messages
	execMu  sync.Mutex              // one execute_request at a time
}

// Connection is a connection file's content
// (https://jupyter-client.readthedocs.io/en/stable/kernels.html#connection-files).
type Connection struct {
	ShellPort       int    `json:"shell_port"`
	IOPubPort       int    `json:"iopub_port"`
	StdinPort       int    `json:"stdin_port"`
	ControlPort     int    `json:"control_port"`
	HBPort          int    `json:"hb_port"`
	IP              string `json:"ip"`
	Key             string `json:"key"`
	Transport       string `json:"transport"`
	SignatureScheme string `json:"signature_scheme"`
	KernelName      string `json:"kernel_name"`
}

// freePorts reserves n distinct loopback TCP ports (closed again before use).
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Start launches the kernel described by cfg.Spec, connects to it and waits until it
// answers kernel_info (ErrNotReady after ReadyTimeout, ErrDead if it exits first).
func Start(ctx context.Context, cfg Config) (*Kernel, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Start == nil {
		cfg.Start = (*exec.Cmd).Start
	}
	if cfg.Wait == nil {
		cfg.Wait = (*exec.Cmd).Wait
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 60 * time.Second
	}
	ports, err := freePorts(5)
	if err != nil {
		return nil, fmt.Errorf("jupyter: ports: %w", err)
	}
	conn := Connection{
		ShellPort: ports[0], IOPubPort: ports[1], StdinPort: ports[2], ControlPort: ports[3], HBPort: ports[4],
		IP: "127.0.0.1", Key: newID(), Transport: "tcp", SignatureScheme: "hmac-sha256", KernelName: cfg.Spec.Name,
	}
	id := newID()
	connFile := filepath.Join(cfg.StateDir, "kernel-"+id+".json")
	b, _ := json.Marshal(conn)
	if err := os.WriteFile(connFile, b, 0o600); err != nil {
		return nil, fmt.Errorf("jupyter: connection file: %w", err)
	}
	argv := make([]string, len(cfg.Spec.Argv))
	for i, a := range cfg.Spec.Argv {
		a = strings.ReplaceAll(a, "{connection_file}", connFile)
		argv[i] = strings.ReplaceAll(a, "{resource_dir}", cfg.Spec.Dir)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = cfg.Dir
	env := cfg.Env
	if env == nil {
		env = os.Environ()
	}
	for k, v := range cfg.Spec.Env {
		env = append(env, k+"="+v)
	}
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = nil, nil
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cfg.Start(cmd); err != nil {
		os.Remove(connFile)
		return nil, fmt.Errorf("jupyter: starting %s: %w", cfg.Spec.Name, err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	k := &Kernel{
		spec: cfg.Spec, cmd: cmd, connFile: connFile, codec: Codec{Key: []byte(conn.Key)},
		session: newID(), log: cfg.Logger, ctx: kctx, cancel: cancel,
		dead: make(chan struct{}), waiters: map[string]chan Message{},
	}
	go func() {
		cfg.Wait(cmd)
		close(k.dead)
		cancel()
	}()
	if err := k.connect(ctx, conn, cfg.ReadyTimeout); err != nil {
		k.Close()
		return nil, err
	}
	return k, nil
}

func (k *Kernel) connect(ctx context.Context, c Connection, timeout time.Duration) error {
	opts := []zmq4.Option{zmq4.WithDialerRetry(100 * time.Millisecond), zmq4.WithDialerMaxRetries(int(timeout / (100 * time.Millisecond)))}
	ep := func(port int) string { return "tcp://" + net.JoinHostPort(c.IP, strconv.Itoa(port)) }
	k.shell = zmq4.NewDealer(k.ctx, opts...)
	k.control = zmq4.NewDealer(k.ctx, opts...)
	k.iopub = zmq4.NewSub(k.ctx, opts...)
	if err := k.iopub.Dial(ep(c.IOPubPort)); err != nil {
		return fmt.Errorf("jupyter: iopub: %w", err)
	}
	if err := k.iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return fmt.Errorf("jupyter: subscribe: %w", err)
	}
	if err := k.shell.Dial(ep(c.ShellPort)); err != nil {
		return fmt.Errorf("jupyter: shell: %w", err)
	}
	if err := k.control.Dial(ep(c.ControlPort)); err != nil {
		return fmt.Errorf("jupyter: control: %w", err)
	}
	go k.readLoop(k.iopub)
	go k.readLoop(k.shell)
	go k.readLoop(k.control)

	// IOPub drops what is published before the subscription reaches the kernel, so ask
	// for kernel_info until its busy/idle status arrives on iopub.
	deadline := time.After(timeout)
	for {
		h, ch, err := k.request(k.shell, "kernel_info_request", struct{}{})
		if err != nil {
			return err
		}
		tick := time.After(500 * time.Millisecond)
	wait:
		for {
			select {
			case m := <-ch:
				if m.Header.MsgType == "status" {
					k.forget(h.MsgID)
					return nil
				}
			case <-tick:
				break wait
			case <-deadline:
				k.forget(h.MsgID)
				return ErrNotReady
			case <-k.dead:
				k.forget(h.MsgID)
				return ErrDead
			case <-ctx.Done():
				k.forget(h.MsgID)
				return ctx.Err()
			}
		}
		k.forget(h.MsgID)
	}
}

// readLoop routes every message of sock to the waiter of its parent msg_id.
func (k *Kernel) readLoop(sock zmq4.Socket) {
	for {
		raw, err := sock.Recv()
		if err != nil {
			return // socket closed with the kernel
		}
		m, err := k.codec.Decode(raw.Frames)
		if err != nil {
			k.log.Warn("jupyter message dropped", "kernel", k.spec.Name, "err", err)
			continue
		}
		k.mu.Lock()
		ch := k.waiters[m.ParentHeader.MsgID]
		k.mu.Unlock()
		if ch == nil {
			continue
		}
		select {
		case ch <- m:
		case <-k.ctx.Done():
			return
		}
	}
}

// request sends a message on sock and registers a channel for the messages it causes.
func (k *Kernel) request(sock zmq4.Socket, msgType string, content any) (Header, chan Message, error) {
	frames, h, err := k.codec.Encode(nil, k.session, "execd", msgType, nil, content)
	if err != nil {
		return h, nil, err
	}
	ch := make(chan Message, 64)
	k.mu.Lock()
	k.waiters[h.MsgID] = ch
	k.mu.Unlock()
	k.sendMu.Lock()
	err = sock.Send(zmq4.NewMsgFrom(frames...))
	k.sendMu.Unlock()
	if err != nil {
		k.forget(h.MsgID)
		return h, nil, fmt.Errorf("jupyter: send %s: %w", msgType, err)
	}
	return h, ch, nil
}

func (k *Kernel) forget(msgID string) {
	k.mu.Lock()
	delete(k.waiters, msgID)
	k.mu.Unlock()
}

// Execute runs code and calls handle with every iopub message it causes (stream,
// execute_input, execute_result, display_data, error, ...) until the kernel is idle
// again. It returns the execute_reply status ("ok", "error", "aborted"). Executions on
// one kernel are serialized. Cancelling ctx interrupts the code and waits for the end.
func (k *Kernel) Execute(ctx context.Context, code string, handle func(Message)) (string, error) {
	k.execMu.Lock()
	defer k.execMu.Unlock()
	select {
	case <-k.dead:
		return "", ErrDead
	default:
	}
	// stop_on_error false: each request is a run of its own. With true, ipykernel
	// aborts (no output, status "aborted") every request that reaches it shortly after a
	// failed one, such as the next cell after an interrupted one.
	h, ch, err := k.request(k.shell, "execute_request", map[string]any{
		"code": code, "silent": false, "store_history": true,
		"user_expressions": map[string]any{}, "allow_stdin": false, "stop_on_error": false,
	})
	if err != nil {
		return "", err
	}
	defer k.forget(h.MsgID)
	status, idle := "", false
	done := ctx.Done()
	for !idle || status == "" {
		select {
		case m := <-ch:
			switch m.Header.MsgType {
			case "execute_reply":
				var c struct {
					Status string `json:"status"`
				}
				json.Unmarshal(m.Content, &c)
				status = c.Status
			case "status":
				var c struct {
					State string `json:"execution_state"`
				}
				json.Unmarshal(m.Content, &c)
				idle = c.State == "idle"
			default:
				handle(m)
			}
		case <-done:
			done = nil
			k.Interrupt()
		case <-k.dead:
			return "", ErrDead
		}
	}
	return status, nil
}

// Interrupt interrupts the running code: SIGINT to the kernel process, or an
// interrupt_request on the control channel when the spec asks for messages.
func (k *Kernel) Interrupt() error {
	select {
	case <-k.dead:
		return ErrDead
	default:
	}
	if k.spec.InterruptMode == "message" {
		h, _, err := k.request(k.control, "interrupt_request", struct{}{})
		k.forget(h.MsgID)
		return err
	}
	return k.cmd.Process.Signal(syscall.SIGINT)
}

// Dead is closed when the kernel process has exited.
func (k *Kernel) Dead() <-chan struct{} { return k.dead }

// Close kills the kernel's process group, closes the sockets and removes the
// connection file.
func (k *Kernel) Close() error {
	if k.cmd.Process != nil {
		syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
	}
	k.cancel()
	for _, s := range []zmq4.Socket{k.shell, k.control, k.iopub} {
		if s != nil {
			s.Close()
		}
	}
	os.Remove(k.connFile)
	return nil
}

// ReadConnection reads and checks a connection file (the kernel side): tcp transport
// and hmac-sha256 (or no key) are supported.
func ReadConnection(path string) (Connection, error) {
	var c Connection
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("jupyter: connection file %s: %w", path, err)
	}
	if c.Transport != "tcp" {
		return c, fmt.Errorf("jupyter: transport %q not supported (tcp only)", c.Transport)
	}
	if c.Key != "" && c.SignatureScheme != "hmac-sha256" {
		return c, fmt.Errorf("jupyter: signature scheme %q not supported (hmac-sha256 only)", c.SignatureScheme)
	}
	return c, nil
}
