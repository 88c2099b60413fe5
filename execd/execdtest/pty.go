package execdtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/airlockdev/airlock/execd"
)

// PTYFrame is one frame a PTY WebSocket received, decoded: Type is "stdout", "stderr"
// or "replay" for binary frames (Data, and Offset for replay), the JSON frame's type
// otherwise (JSON holds it), or "closed" once the connection ended (Err, CloseCode).
type PTYFrame struct {
	Type      string
	Data      []byte
	Offset    int64
	JSON      execd.PTYServerFrame
	Err       error
	CloseCode websocket.StatusCode
}

// PTYClient is a test client of execd's PTY WebSocket (GET /pty/{id}/ws): a goroutine
// decodes every frame into Frames.
type PTYClient struct {
	WS     *websocket.Conn
	Frames chan PTYFrame
	// Out is every output byte seen by Expect and WaitFor (stdout, stderr, replay).
	Out bytes.Buffer
	// pending is output Expect read past its match: the next Expect starts with it
	// (one frame may carry the output of several lines).
	pending []byte
}

// DialPTY opens url (ws://…/pty/{id}/ws?…) with the headers hdr through hc (nil: the
// default client). On a refused handshake it returns the HTTP response and an error.
func DialPTY(ctx context.Context, url string, hdr http.Header, hc *http.Client) (*PTYClient, *http.Response, error) {
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: hdr, HTTPClient: hc})
	if err != nil {
		return nil, resp, err
	}
	ws.SetReadLimit(8 << 20)
	c := &PTYClient{WS: ws, Frames: make(chan PTYFrame, 4096)}
	go c.read()
	return c, resp, nil
}

// MustDialPTY is DialPTY that fails the test on error and closes the client at its end.
func MustDialPTY(t testing.TB, url string, hdr http.Header, hc *http.Client) *PTYClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, resp, err := DialPTY(ctx, url, hdr, hc)
	if err != nil {
		st := 0
		if resp != nil {
			st = resp.StatusCode
		}
		t.Fatalf("dialing %s: %v (HTTP %d)", url, err, st)
	}
	t.Cleanup(func() { c.WS.CloseNow() })
	return c
}

func (c *PTYClient) read() {
	defer close(c.Frames)
	for {
		typ, msg, err := c.WS.Read(context.Background())
		if err != nil {
			c.Frames <- PTYFrame{Type: "closed", Err: err, CloseCode: websocket.CloseStatus(err)}
			return
		}
		f := PTYFrame{}
		switch {
		case typ == websocket.MessageText:
			if err := json.Unmarshal(msg, &f.JSON); err != nil {
				f.Type, f.Err = "invalid", err
			} else {
				f.Type = f.JSON.Type
			}
		case len(msg) == 0:
			f.Type = "invalid"
		case msg[0] == execd.PTYStdout:
			f.Type, f.Data = "stdout", msg[1:]
		case msg[0] == execd.PTYStderr:
			f.Type, f.Data = "stderr", msg[1:]
		case msg[0] == execd.PTYReplay && len(msg) >= 9:
			f.Type, f.Offset, f.Data = "replay", int64(binary.BigEndian.Uint64(msg[1:9])), msg[9:]
		default:
			f.Type, f.Err = "invalid", fmt.Errorf("binary frame of channel %#x", msg[0])
		}
		c.Frames <- f
	}
}

// Next returns the next frame, or a "timeout" frame after d.
func (c *PTYClient) Next(d time.Duration) PTYFrame {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case f, ok := <-c.Frames:
		if !ok {
			return PTYFrame{Type: "closed", Err: errors.New("no more frames")}
		}
		return f
	case <-t.C:
		return PTYFrame{Type: "timeout"}
	}
}

// WaitFor reads frames until one of type typ (output frames are kept in Out) and returns
// it; it fails the test after d or when the connection ends first.
func (c *PTYClient) WaitFor(t testing.TB, typ string, d time.Duration) PTYFrame {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		f := c.Next(time.Until(deadline))
		if f.Type == typ {
			if f.Data != nil {
				c.Out.Write(f.Data)
			}
			return f
		}
		switch f.Type {
		case "stdout", "stderr", "replay":
			c.Out.Write(f.Data)
		case "timeout", "closed":
			t.Fatalf("waiting for a %q frame: got %s (%v); output so far %q", typ, f.Type, f.Err, c.Out.String())
		}
	}
}

// Expect reads output frames until the output not yet consumed (what came after the
// last Expect's match, then what arrives) contains want, consumes it through the end of
// want's first occurrence and returns the consumed output; it fails the test after d.
// Output read by WaitFor is consumed.
func (c *PTYClient) Expect(t testing.TB, want string, d time.Duration) string {
	t.Helper()
	got := bytes.NewBuffer(c.pending)
	c.pending = nil
	deadline := time.Now().Add(d)
	for {
		if i := strings.Index(got.String(), want); i >= 0 {
			end := i + len(want)
			c.pending = append([]byte(nil), got.Bytes()[end:]...)
			return got.String()[:end]
		}
		f := c.Next(time.Until(deadline))
		switch f.Type {
		case "stdout", "stderr", "replay":
			got.Write(f.Data)
			c.Out.Write(f.Data)
		case "timeout", "closed", "invalid":
			t.Fatalf("waiting for %q: got %s (%v); output %q", want, f.Type, f.Err, got.String())
		}
	}
}

// Stdin sends s as a binary stdin frame.
func (c *PTYClient) Stdin(t testing.TB, s string) {
	t.Helper()
	if err := c.WS.Write(context.Background(), websocket.MessageBinary, append([]byte{execd.PTYStdin}, s...)); err != nil {
		t.Fatalf("stdin: %v", err)
	}
}

// Send sends f as a JSON text frame.
func (c *PTYClient) Send(t testing.TB, f execd.PTYClientFrame) {
	t.Helper()
	b, _ := json.Marshal(f)
	if err := c.WS.Write(context.Background(), websocket.MessageText, b); err != nil {
		t.Fatalf("sending %s: %v", b, err)
	}
}
