package execd

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// WebSocket limits and timings of a PTY session's connection.
const (
	// PTYFrameBytes is the most output one binary frame carries (after its channel byte).
	PTYFrameBytes = 32 << 10
	// PTYReadLimit is the largest message execd accepts from a client (a pasted stdin
	// frame, for example): 1 MiB; a larger one closes the connection (1009).
	PTYReadLimit = 1 << 20
	// PTYPingInterval is how often execd pings an idle client; one that does not answer
	// within ptyWriteTimeout is disconnected (the session stays).
	PTYPingInterval = 30 * time.Second
	// PTYCloseTakenOver is the close code (RFC 6455 §7.4.2 private range) a holder gets
	// when another client takes the session over (?takeover=1); the reason is
	// "TAKEN_OVER".
	PTYCloseTakenOver websocket.StatusCode = 4001

	ptyWriteTimeout = 10 * time.Second
)

// PTYClientFrame is a JSON text frame from the client: {"type":"resize","cols":C,
// "rows":R}, {"type":"signal","signal":"SIGINT"}, {"type":"ping"} or
// {"type":"stdin","data":"text"} (stdin as plain text, for debugging tools).
type PTYClientFrame struct {
	Type   string `json:"type"`
	Data   string `json:"data,omitempty"`
	Cols   int    `json:"cols,omitempty"`
	Rows   int    `json:"rows,omitempty"`
	Signal string `json:"signal,omitempty"`
}

// PTYServerFrame is a JSON text frame from execd: "connected" (session_id, mode "pty" or
// "pipe"), "exit" (exit_code; 128+N when signal N ended the shell), "pong", or "error"
// (code: START_FAILED, STDIN_WRITE_FAILED, INVALID_FRAME; error: the message).
type PTYServerFrame struct {
	Type      string `json:"type"`
	SessionID string `json:"session_id,omitempty"`
	Mode      string `json:"mode,omitempty"`
	ExitCode  *int   `json:"exit_code,omitempty"`
	Error     string `json:"error,omitempty"`
	Code      string `json:"code,omitempty"`
}

// ptyConn is one WebSocket attached to a session.
type ptyConn struct {
	ws        *websocket.Conn
	evicted   chan struct{} // closed when another client took the session over
	evictOnce sync.Once
}

func (c *ptyConn) evict() { c.evictOnce.Do(func() { close(c.evicted) }) }

func (c *ptyConn) isEvicted() bool {
	select {
	case <-c.evicted:
		return true
	default:
		return false
	}
}

// sent records that holder c was sent the output up to off (flow control), if c still
// holds the session.
func (p *ptySession) sent(c *ptyConn, off int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.holder == c {
		p.out.setHold(off)
	}
}

// release drops c as the holder, if it still is.
func (p *ptySession) release(c *ptyConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.holder == c {
		p.holder = nil
		p.out.setHold(-1)
	}
}

// handlePTYSocket serves GET /pty/{id}/ws (execd-pty.md): 404 for an unknown session,
// 409 ALREADY_CONNECTED while another client holds it (unless ?takeover=1, which evicts
// that client once this handshake succeeded), 400 for a malformed since. Then the shell
// starts if it does not run (?pty=0: pipe mode), a "connected" frame, the output from
// since (default 0) as one replay frame, and live output until the shell exits (an
// "exit" frame, then close 1000) or the client goes.
func (s *Server) handlePTYSocket(w http.ResponseWriter, r *http.Request) {
	p, err := s.ptys.get(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	usePTY := q.Get("pty") != "0"
	var since int64
	if v := q.Get("since"); v != "" {
		if since, err = strconv.ParseInt(v, 10, 64); err != nil || since < 0 {
			writeError(w, invalidf("since must be a byte offset (a number from 0), got %q", v))
			return
		}
	}
	takeover := q.Get("takeover") == "1" && isWebSocketUpgrade(r)

	c := &ptyConn{evicted: make(chan struct{})}
	p.mu.Lock()
	switch {
	case p.closed:
		p.mu.Unlock()
		writeError(w, errorf(ErrNotFound, "pty session %q not found", p.id))
		return
	case p.holder != nil && !takeover:
		p.mu.Unlock()
		writeError(w, errorf(ErrAlreadyConnected, "another client is connected to pty session %q; connect with takeover=1 to take it over", p.id))
		return
	case p.holder == nil:
		p.holder = c // reserved before the handshake: a concurrent client gets 409
		takeover = false
	}
	p.mu.Unlock()

	// Authentication is the X-EXECD-ACCESS-TOKEN header (checked by the middleware), which
	// a browser never attaches on its own, so a cross-origin page gains nothing from the
	// Origin check and any Origin may connect (as OpenSandbox's execd does). Without a
	// token execd authenticates nothing, WebSocket or not; Airlock always sets one.
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		p.release(c)
		return // Accept answered the client
	}
	c.ws = ws
	ws.SetReadLimit(PTYReadLimit)
	defer p.release(c)
	if takeover {
		// Only now that this handshake succeeded is the holder evicted (closed with 4001).
		p.mu.Lock()
		old := p.holder
		p.holder = c
		p.mu.Unlock()
		if old != nil {
			old.evict()
		}
	}

	before := p.out.Total()
	started, err := s.startPTY(p, usePTY)
	if err != nil {
		s.log.Warn("pty session did not start", "session_id", p.id, "err", err)
		s.ptyJSON(ws, PTYServerFrame{Type: "error", Code: "START_FAILED", Error: err.Error()})
		ws.Close(websocket.StatusInternalError, "START_FAILED")
		return
	}
	p.mu.Lock()
	mode, done := "pipe", p.done
	if p.isPTY {
		mode = "pty"
	}
	p.mu.Unlock()
	if s.ptyJSON(ws, PTYServerFrame{Type: "connected", SessionID: p.id, Mode: mode}) != nil {
		ws.CloseNow()
		return
	}
	next := before
	if !started {
		data, from := p.out.snapshot(since)
		next = from + int64(len(data))
		if len(data) > 0 {
			frame := make([]byte, 9+len(data))
			frame[0] = PTYReplay
			binary.BigEndian.PutUint64(frame[1:9], uint64(from))
			copy(frame[9:], data)
			if s.ptyWrite(ws, websocket.MessageBinary, frame) != nil {
				ws.CloseNow()
				return
			}
		}
	}
	p.sent(c, next)

	readerGone := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		s.ptyPump(p, c, next, done, readerGone)
	}()
	go func() {
		defer wg.Done()
		t := time.NewTicker(PTYPingInterval)
		defer t.Stop()
		for {
			select {
			case <-readerGone:
				return
			case <-t.C:
				ctx, cancel := context.WithTimeout(context.Background(), ptyWriteTimeout)
				err := ws.Ping(ctx)
				cancel()
				if err != nil {
					ws.CloseNow()
					return
				}
			}
		}
	}()
	s.ptyReadLoop(p, c)
	close(readerGone)
	wg.Wait()
}

// ptyPump sends the session's output from offset next to c until the shell exits (then
// the exit frame and close 1000), c is evicted (close 4001) or c's reader ended.
func (s *Server) ptyPump(p *ptySession, c *ptyConn, next int64, done <-chan struct{}, readerGone <-chan struct{}) {
	ws := c.ws
	exiting := false
	frame := make([]byte, 1+PTYFrameBytes)
	for {
		if c.isEvicted() { // checked first: a shell that never stops writing must not keep it
			ws.Close(PTYCloseTakenOver, "TAKEN_OVER")
			return
		}
		data, ch, from, wake := p.out.next(next, PTYFrameBytes)
		if len(data) > 0 {
			frame[0] = ch
			n := copy(frame[1:], data)
			if s.ptyWrite(ws, websocket.MessageBinary, frame[:1+n]) != nil {
				ws.CloseNow()
				return
			}
			next = from + int64(n)
			p.sent(c, next)
			continue
		}
		if exiting {
			// Released before the exit frame: a client that reconnects on it is not refused.
			p.release(c)
			p.mu.Lock()
			code := p.exitCode
			p.mu.Unlock()
			s.ptyJSON(ws, PTYServerFrame{Type: "exit", ExitCode: &code})
			ws.Close(websocket.StatusNormalClosure, "process exited")
			return
		}
		select {
		case <-wake:
		case <-done:
			// Every byte of the shell's output is in the log once done is closed.
			exiting = true
		case <-c.evicted:
			ws.Close(PTYCloseTakenOver, "TAKEN_OVER")
			return
		case <-readerGone:
			ws.CloseNow()
			return
		}
	}
}

// ptyReadLoop handles the client's frames until the connection ends.
func (s *Server) ptyReadLoop(p *ptySession, c *ptyConn) {
	for {
		typ, msg, err := c.ws.Read(context.Background())
		if err != nil {
			return
		}
		if c.isEvicted() {
			continue // no longer the holder: its input goes nowhere
		}
		if typ == websocket.MessageBinary {
			if len(msg) == 0 || msg[0] != PTYStdin {
				continue
			}
			if err := p.writeStdin(msg[1:]); err != nil {
				s.ptyJSON(c.ws, PTYServerFrame{Type: "error", Code: "STDIN_WRITE_FAILED", Error: err.Error()})
			}
			continue
		}
		var f PTYClientFrame
		if err := json.Unmarshal(msg, &f); err != nil {
			s.ptyJSON(c.ws, PTYServerFrame{Type: "error", Code: "INVALID_FRAME", Error: "a text frame must be a JSON object with a type"})
			continue
		}
		switch f.Type {
		case "stdin":
			if err := p.writeStdin([]byte(f.Data)); err != nil {
				s.ptyJSON(c.ws, PTYServerFrame{Type: "error", Code: "STDIN_WRITE_FAILED", Error: err.Error()})
			}
		case "resize":
			if err := p.resize(f.Cols, f.Rows); err != nil {
				s.ptyJSON(c.ws, PTYServerFrame{Type: "error", Code: "INVALID_FRAME", Error: err.Error()})
			}
		case "signal":
			if err := p.signal(f.Signal); err != nil {
				s.ptyJSON(c.ws, PTYServerFrame{Type: "error", Code: "INVALID_FRAME", Error: err.Error()})
			}
		case "ping":
			s.ptyJSON(c.ws, PTYServerFrame{Type: "pong"})
		default:
			s.ptyJSON(c.ws, PTYServerFrame{Type: "error", Code: "INVALID_FRAME", Error: "unknown frame type " + strconv.Quote(f.Type)})
		}
	}
}

func (s *Server) ptyWrite(ws *websocket.Conn, typ websocket.MessageType, b []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), ptyWriteTimeout)
	defer cancel()
	return ws.Write(ctx, typ, b)
}

func (s *Server) ptyJSON(ws *websocket.Conn, f PTYServerFrame) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return s.ptyWrite(ws, websocket.MessageText, b)
}

// isWebSocketUpgrade reports whether r asks for a WebSocket (Connection: upgrade,
// Upgrade: websocket).
func isWebSocketUpgrade(r *http.Request) bool {
	return headerHasToken(r.Header, "Connection", "upgrade") && headerHasToken(r.Header, "Upgrade", "websocket")
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
