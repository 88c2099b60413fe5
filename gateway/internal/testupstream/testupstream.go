// Package testupstream is the HTTP application the gateway's tests run inside sandboxes
// (built as a static binary from ./upstream) and on loopback: a JSON echo, a WebSocket
// echo, a paced SSE stream, and endpoints that hold a request open.
//
//	GET  /anything        {"method","host","path","rawPath","query","proto","headers"}
//	GET  /plain           "ok\n" (benchmarks)
//	GET  /respond?h=N:V…  200 with each h ("Name: value") added as a response header, in
//	                      order, and the body "<p>respond</p>" (no Content-Type unless an h
//	                      sets one; Go's server then sniffs text/html)
//	GET  /ws              WebSocket (RFC 6455) echo, message by message
//	GET  /sse?n=N&key=K   text/event-stream; event i+1 is sent only after GET /ack?key=K
//	GET  /ack?key=K       releases the next SSE event of stream K
//	GET  /hold?key=K      sends headers and one line, then waits for GET /release?key=K
//	                      or the client's disconnect (at most 2 minutes)
//	GET  /release?key=K   ends every /hold with key K
package testupstream

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/websocket"
)

// Echo is the JSON body of the echo endpoint.
type Echo struct {
	Method  string      `json:"method"`
	Host    string      `json:"host"`
	Path    string      `json:"path"`
	RawPath string      `json:"rawPath"`
	Query   string      `json:"query"`
	Proto   string      `json:"proto"`
	Headers http.Header `json:"headers"`
}

// maxWait bounds every wait so a broken test never leaves the server hanging.
const maxWait = 2 * time.Minute

type server struct {
	mu    sync.Mutex
	chans map[string]chan struct{} // key → signal (ack: buffered; release: closed)
}

// Handler returns the application.
func Handler() http.Handler {
	s := &server{chans: make(map[string]chan struct{})}
	mux := http.NewServeMux()
	mux.Handle("/ws", websocket.Server{Handler: wsEcho})
	mux.HandleFunc("/sse", s.sse)
	mux.HandleFunc("/ack", s.ack)
	mux.HandleFunc("/hold", s.hold)
	mux.HandleFunc("/release", s.release)
	mux.HandleFunc("/plain", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/respond", respond)
	mux.HandleFunc("/", echo)
	return mux
}

// wsEcho sends every message back whole.
func wsEcho(c *websocket.Conn) {
	for {
		var msg []byte
		if err := websocket.Message.Receive(c, &msg); err != nil {
			return
		}
		if err := websocket.Message.Send(c, string(msg)); err != nil {
			return
		}
	}
}

// respond answers with the response headers the query's h parameters name.
func respond(w http.ResponseWriter, r *http.Request) {
	for _, h := range r.URL.Query()["h"] {
		if k, v, ok := strings.Cut(h, ":"); ok {
			w.Header().Add(strings.TrimSpace(k), strings.TrimSpace(v))
		}
	}
	_, _ = w.Write([]byte("<p>respond</p>"))
}

func echo(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(Echo{Method: r.Method, Host: r.Host, Path: r.URL.Path, RawPath: r.URL.RawPath,
		Query: r.URL.RawQuery, Proto: r.Proto, Headers: r.Header})
}

func (s *server) ch(key string, buffered bool) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.chans[key]
	if !ok {
		if buffered {
			c = make(chan struct{}, 64)
		} else {
			c = make(chan struct{})
		}
		s.chans[key] = c
	}
	return c
}

func (s *server) sse(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.Atoi(r.URL.Query().Get("n"))
	ack := s.ch("sse/"+r.URL.Query().Get("key"), true)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	rc := http.NewResponseController(w)
	for i := 1; i <= n; i++ {
		if i > 1 {
			select {
			case <-ack:
			case <-r.Context().Done():
				return
			case <-time.After(maxWait):
				return
			}
		}
		fmt.Fprintf(w, "id: %d\ndata: {\"type\":\"event\",\"seq\":%d}\n\n", i, i)
		if rc.Flush() != nil {
			return
		}
	}
}

func (s *server) ack(w http.ResponseWriter, r *http.Request) {
	select {
	case s.ch("sse/"+r.URL.Query().Get("key"), true) <- struct{}{}:
	default:
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) hold(w http.ResponseWriter, r *http.Request) {
	rel := s.ch("hold/"+r.URL.Query().Get("key"), false)
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintln(w, "holding")
	_ = http.NewResponseController(w).Flush()
	select {
	case <-rel:
		fmt.Fprintln(w, "released")
	case <-r.Context().Done():
	case <-time.After(maxWait):
	}
}

func (s *server) release(w http.ResponseWriter, r *http.Request) {
	key := "hold/" + r.URL.Query().Get("key")
	c := s.ch(key, false)
	s.mu.Lock()
	delete(s.chans, key)
	s.mu.Unlock()
	close(c)
	w.WriteHeader(http.StatusNoContent)
}
