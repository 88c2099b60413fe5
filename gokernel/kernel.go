// Package gokernel is a Jupyter kernel for Go: the yaegi interpreter behind the Jupyter
// messaging protocol (wire protocol 5.3, HMAC-SHA256 signed frames over ZeroMQ through
// the pure-Go go-zeromq/zmq4: https://jupyter-client.readthedocs.io/en/stable/messaging.html).
// It keeps state across cells, streams stdout and stderr as they are written, shows the
// value of a cell's last expression, reports compile errors and panics with a
// traceback, and stops running code on SIGINT or an interrupt_request. It needs no Go
// toolchain and no network: the standard library is built in.
package gokernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync"

	"github.com/go-zeromq/zmq4"

	"github.com/airlockdev/airlock/execd/jupyter"
)

// Version is the kernel's implementation version (kernel_info_reply).
const Version = "0.1.0"

// Kernel serves one connection file's sockets.
type Kernel struct {
	conn  jupyter.Connection
	codec jupyter.Codec
	log   *slog.Logger
	in    *Interpreter

	ctx     context.Context
	cancel  context.CancelFunc
	shell   zmq4.Socket
	control zmq4.Socket
	stdin   zmq4.Socket
	iopub   zmq4.Socket
	hb      zmq4.Socket
	pubMu   sync.Mutex

	mu        sync.Mutex
	parent    *jupyter.Message   // the request whose output is being written
	interrupt context.CancelFunc // cancels the running cell
	count     int
}

// New binds the sockets of conn. Close releases them.
func New(conn jupyter.Connection, log *slog.Logger) (*Kernel, error) {
	ctx, cancel := context.WithCancel(context.Background())
	k := &Kernel{conn: conn, codec: jupyter.Codec{Key: []byte(conn.Key)}, log: log, ctx: ctx, cancel: cancel}
	in, err := NewInterpreter(streamWriter{k, "stdout"}, streamWriter{k, "stderr"})
	if err != nil {
		cancel()
		return nil, err
	}
	k.in = in
	k.shell, k.control, k.stdin = zmq4.NewRouter(ctx), zmq4.NewRouter(ctx), zmq4.NewRouter(ctx)
	k.iopub, k.hb = zmq4.NewPub(ctx), zmq4.NewRep(ctx)
	for _, s := range []struct {
		sock zmq4.Socket
		port int
	}{{k.shell, conn.ShellPort}, {k.control, conn.ControlPort}, {k.stdin, conn.StdinPort}, {k.iopub, conn.IOPubPort}, {k.hb, conn.HBPort}} {
		if err := s.sock.Listen("tcp://" + net.JoinHostPort(conn.IP, strconv.Itoa(s.port))); err != nil {
			k.Close()
			return nil, fmt.Errorf("gokernel: listen on port %d: %w", s.port, err)
		}
	}
	return k, nil
}

// Run serves requests until ctx ends or a shutdown_request arrives.
func (k *Kernel) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, k.cancel)
	defer stop()
	go k.heartbeat()
	go k.serve(k.control)
	go k.serve(k.shell)
	<-k.ctx.Done()
	return nil
}

// Interrupt stops the running cell, if any (SIGINT does this).
func (k *Kernel) Interrupt() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.interrupt != nil {
		k.interrupt()
	}
}

// Close releases the sockets.
func (k *Kernel) Close() error {
	k.cancel()
	var errs []error
	for _, s := range []zmq4.Socket{k.shell, k.control, k.stdin, k.iopub, k.hb} {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	return errors.Join(errs...)
}

func (k *Kernel) heartbeat() {
	for {
		m, err := k.hb.Recv()
		if err != nil {
			return
		}
		if err := k.hb.Send(m); err != nil {
			return
		}
	}
}

// serve handles the requests of a ROUTER socket, one at a time: an execute_request on
// shell blocks shell while control stays free for interrupts.
func (k *Kernel) serve(sock zmq4.Socket) {
	for {
		raw, err := sock.Recv()
		if err != nil {
			return
		}
		m, err := k.codec.Decode(raw.Frames)
		if err != nil {
			k.log.Warn("message dropped", "err", err)
			continue
		}
		k.handle(sock, m)
	}
}

func (k *Kernel) handle(sock zmq4.Socket, m jupyter.Message) {
	k.publish(&m, "status", map[string]string{"execution_state": "busy"})
	defer k.publish(&m, "status", map[string]string{"execution_state": "idle"})
	switch t := m.Header.MsgType; t {
	case "kernel_info_request":
		k.reply(sock, &m, "kernel_info_reply", map[string]any{
			"status": "ok", "protocol_version": jupyter.ProtocolVersion,
			"implementation": "airlock-gokernel", "implementation_version": Version,
			"language_info": map[string]any{
				"name": "go", "version": runtime.Version(), "mimetype": "text/x-go", "file_extension": ".go",
			},
			"banner": "Go " + runtime.Version() + " (yaegi interpreter, Airlock gokernel " + Version + ")",
		})
	case "execute_request":
		k.execute(sock, &m)
	case "interrupt_request":
		k.Interrupt()
		k.reply(sock, &m, "interrupt_reply", map[string]any{"status": "ok"})
	case "shutdown_request":
		var c struct {
			Restart bool `json:"restart"`
		}
		json.Unmarshal(m.Content, &c)
		k.reply(sock, &m, "shutdown_reply", map[string]any{"status": "ok", "restart": c.Restart})
		k.cancel()
	case "is_complete_request":
		k.reply(sock, &m, "is_complete_reply", map[string]any{"status": "unknown"})
	case "complete_request":
		k.reply(sock, &m, "complete_reply", map[string]any{"status": "ok", "matches": []string{},
			"cursor_start": 0, "cursor_end": 0, "metadata": map[string]any{}})
	case "inspect_request":
		k.reply(sock, &m, "inspect_reply", map[string]any{"status": "ok", "found": false, "data": map[string]any{}, "metadata": map[string]any{}})
	case "comm_info_request":
		k.reply(sock, &m, "comm_info_reply", map[string]any{"status": "ok", "comms": map[string]any{}})
	case "history_request":
		k.reply(sock, &m, "history_reply", map[string]any{"status": "ok", "history": []any{}})
	default:
		k.log.Info("request ignored", "msg_type", t)
	}
}

func (k *Kernel) execute(sock zmq4.Socket, m *jupyter.Message) {
	var req struct {
		Code         string `json:"code"`
		Silent       bool   `json:"silent"`
		StoreHistory *bool  `json:"store_history"`
	}
	if err := json.Unmarshal(m.Content, &req); err != nil {
		k.log.Warn("bad execute_request", "err", err)
		return
	}
	ctx, cancel := context.WithCancel(k.ctx)
	defer cancel()
	k.mu.Lock()
	if !req.Silent && (req.StoreHistory == nil || *req.StoreHistory) {
		k.count++
	}
	n := k.count
	k.parent, k.interrupt = m, cancel
	k.mu.Unlock()
	k.publish(m, "execute_input", map[string]any{"code": req.Code, "execution_count": n})

	out := k.in.Run(ctx, req.Code)

	k.mu.Lock()
	k.interrupt = nil
	k.mu.Unlock()
	if e := out.Err; e != nil {
		k.publish(m, "error", map[string]any{"ename": e.Name, "evalue": e.Value, "traceback": e.Traceback})
		k.reply(sock, m, "execute_reply", map[string]any{"status": "error", "execution_count": n,
			"ename": e.Name, "evalue": e.Value, "traceback": e.Traceback})
		return
	}
	if out.Display != "" && !req.Silent {
		k.publish(m, "execute_result", map[string]any{"execution_count": n,
			"data": map[string]string{"text/plain": out.Display}, "metadata": map[string]any{}})
	}
	k.reply(sock, m, "execute_reply", map[string]any{"status": "ok", "execution_count": n,
		"user_expressions": map[string]any{}, "payload": []any{}})
}

func (k *Kernel) reply(sock zmq4.Socket, parent *jupyter.Message, msgType string, content any) {
	frames, _, err := k.codec.Encode(parent.Identities, parent.Header.Session, "kernel", msgType, parent.RawHeader, content)
	if err == nil {
		err = sock.Send(zmq4.NewMsgFrom(frames...))
	}
	if err != nil {
		k.log.Warn("reply not sent", "msg_type", msgType, "err", err)
	}
}

// publish sends an iopub message whose topic is its type.
func (k *Kernel) publish(parent *jupyter.Message, msgType string, content any) {
	var session string
	var raw []byte
	if parent != nil {
		session, raw = parent.Header.Session, parent.RawHeader
	}
	frames, _, err := k.codec.Encode([][]byte{[]byte(msgType)}, session, "kernel", msgType, raw, content)
	if err != nil {
		k.log.Warn("iopub message not built", "msg_type", msgType, "err", err)
		return
	}
	k.pubMu.Lock()
	defer k.pubMu.Unlock()
	if err := k.iopub.Send(zmq4.NewMsgFrom(frames...)); err != nil && k.ctx.Err() == nil {
		k.log.Warn("iopub message not sent", "msg_type", msgType, "err", err)
	}
}

// streamWriter publishes every write as a stream message of the current request.
type streamWriter struct {
	k    *Kernel
	name string
}

func (w streamWriter) Write(p []byte) (int, error) {
	w.k.mu.Lock()
	parent := w.k.parent
	w.k.mu.Unlock()
	w.k.publish(parent, "stream", map[string]string{"name": w.name, "text": string(p)})
	return len(p), nil
}
