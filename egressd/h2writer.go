package egressd

import (
	"net/http"
	"strings"
)

// connectionFields are the connection-specific header fields an HTTP/2 message must not
// carry (RFC 9113 §8.2.2): a client such as curl (nghttp2) ends a stream whose response
// has one with PROTOCOL_ERROR. Go's HTTP/2 server removes Connection only; an upstream
// speaking HTTP/1.1 (Node's http server, say) sends Keep-Alive with every answer.
var connectionFields = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade"}

// h2Writer is the ResponseWriter of an intercepted HTTP/2 stream: the upstream's answer,
// copied by the interception proxy, loses its connection-specific fields (those above
// and those Connection names) before each header block is written.
type h2Writer struct {
	http.ResponseWriter
	final bool // the final (non-1xx) header block is written
}

func (h *h2Writer) scrub() {
	hdr := h.ResponseWriter.Header()
	for _, v := range hdr.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				hdr.Del(name)
			}
		}
	}
	for _, k := range connectionFields {
		hdr.Del(k)
	}
}

// WriteHeader writes a header block without connection-specific fields.
func (h *h2Writer) WriteHeader(code int) {
	if !h.final {
		h.scrub()
		h.final = code >= 200
	}
	h.ResponseWriter.WriteHeader(code)
}

// Write writes body bytes, the header block first when not yet written.
func (h *h2Writer) Write(p []byte) (int, error) {
	if !h.final {
		h.scrub()
		h.final = true
	}
	return h.ResponseWriter.Write(p)
}

// Flush sends what is buffered (streamed answers), the header block first.
func (h *h2Writer) Flush() {
	if !h.final {
		h.scrub()
		h.final = true
	}
	_ = http.NewResponseController(h.ResponseWriter).Flush()
}

// Unwrap gives http.ResponseController the stream's own writer.
func (h *h2Writer) Unwrap() http.ResponseWriter { return h.ResponseWriter }
