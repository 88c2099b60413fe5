package egressd

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/policies"
)

// relayHTTP serves a plain-HTTP connection whose first request the L7 check allowed
// for name: it terminates HTTP/1 rather than splicing, so that EVERY request on the
// connection has its Host checked, not only the first (a kept-alive connection to a
// CDN address would otherwise carry a second request for any other site there).
//
// Requests are read one by one (pipelined ones in order), each decided like the first
// when its Host is a name not yet allowed on this connection (decideL7 against the
// current policy; a new name's decision is audited), and written to the upstream in a
// normalised form: origin-form target, exactly one Host header naming what was checked
// (an absolute-form target or a second Host header cannot smuggle another name past
// the check), no Upgrade other than websocket (h2c would turn the connection into
// HTTP/2 streams with their own authorities) and no CONNECT. Each response is relayed
// before the next request is read. A refused request gets a 403 and the connection
// closes. After a 101 Switching Protocols (websocket) the bytes are no longer HTTP
// requests and the connection is spliced.
//
// Terminating is chosen over closing after the first response: clients keep their
// keep-alive connections (one TCP and one L7 decision per page, not per request), and
// the upstream sees the request exactly as it was checked.
func (p *l7Proxy) relayHTTP(c, up *net.TCPConn, seen []byte, src, dst netip.AddrPort, name string, rules *policies.HTTPHost) {
	d := p.d
	sr := bytes.NewReader(seen)
	cr := bufio.NewReader(io.MultiReader(sr, c))
	cw := bufio.NewWriter(c)
	ur := bufio.NewReader(up)
	uw := bufio.NewWriter(up)
	// allowed maps the names allowed on this connection to their HTTP rules (nil: none).
	allowed := map[string]*policies.HTTPHost{policies.NormalizeName(name): rules}
	for {
		req, err := http.ReadRequest(cr)
		if err != nil {
			return // the client closed, or sent something that is not an HTTP/1 request
		}
		host := requestName(req)
		if req.URL.Opaque != "" {
			host = "" // "GET http:name HTTP/1.1": no authority to check
		}
		hostRules, known := allowed[host]
		if !known || req.Method == http.MethodConnect {
			sbx, ok := d.lookup(src.Addr())
			if !ok {
				return
			}
			rec, r, ok := d.decideL7(sbx, src, dst, host, "http")
			if req.Method == http.MethodConnect {
				rec.Action, rec.Rule, rec.Reason, ok = string(policies.Deny), "l7", "CONNECT inside a checked HTTP connection", false
			}
			if d.cfg.Audit != nil {
				d.cfg.Audit.Append(rec)
			}
			if !ok {
				io.WriteString(c, l7Forbidden)
				return
			}
			hostRules = r
			if len(allowed) < 16 {
				allowed[host] = r
			}
		}
		if hostRules != nil {
			// The host has HTTP rules: this request must pass them.
			sbx, _ := d.lookup(src.Addr())
			base := audit.Record{SandboxID: sbx.ID, Source: audit.SourceL7, Src: src.String(), DstHost: host,
				DstIP: dst.Addr().String(), DstPort: int(dst.Port()), Proto: "http"}
			rec, dec := checkRequest(hostRules, req, base, func() { io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n") })
			if d.cfg.Audit != nil {
				d.cfg.Audit.Append(rec)
			}
			if !dec.Allowed() {
				resp := deniedResponse(req, host, dec)
				resp.Write(c)
				return
			}
		}
		normalizeRequest(req)
		sent := make(chan error, 1)
		go func() {
			// Concurrently with the responses: a client that sent "Expect:
			// 100-continue" waits for the upstream's 100 before its body.
			err := req.Write(uw)
			if err == nil {
				err = uw.Flush()
			}
			sent <- err
		}()
		resp, err := relayResponse(cw, ur, req)
		if err != nil {
			return
		}
		if err := <-sent; err != nil {
			return
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			// What each side already buffered goes first, then the raw streams.
			pending := io.MultiReader(bytes.NewReader(peekAll(cr)), sr)
			if _, err := io.Copy(up, pending); err != nil {
				return
			}
			if _, err := c.Write(peekAll(ur)); err != nil {
				return
			}
			splice(c, up)
			return
		}
		if resp.Close || req.Close {
			return
		}
	}
}

// relayResponse reads the upstream's responses to req from ur and writes them to the
// client: interim 1xx ones (not to an HTTP/1.0 client), then the final one, flushing
// whenever the upstream has nothing more buffered so that streamed bodies (chunked,
// server-sent events) reach the client as they arrive. The final response is returned
// with its body consumed.
func relayResponse(cw *bufio.Writer, ur *bufio.Reader, req *http.Request) (*http.Response, error) {
	old := !req.ProtoAtLeast(1, 1)
	for {
		resp, err := http.ReadResponse(ur, req)
		if err != nil {
			return nil, err
		}
		interim := resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols
		if interim && old {
			continue
		}
		if old {
			// The upstream got HTTP/1.1 (Request.Write); an HTTP/1.0 client reads
			// neither chunked bodies nor kept-alive connections without a length.
			resp.ProtoMajor, resp.ProtoMinor, resp.Proto = 1, 0, "HTTP/1.0"
			if len(resp.TransferEncoding) > 0 {
				resp.TransferEncoding, resp.ContentLength, resp.Close = nil, -1, true
			}
		}
		body := resp.Body
		resp.Body = &flushingBody{r: body, ur: ur, cw: cw}
		err = resp.Write(writeOnly{cw})
		if err == nil {
			body.Close() // at EOF: nothing left to drain
			err = cw.Flush()
		}
		if err != nil || !interim {
			return resp, err
		}
	}
}

// normalizeRequest prepares a checked request for the upstream: Request.Write sends
// the origin-form target and one Host header (req.Host, the checked name); Go's own
// User-Agent is not added; an Upgrade other than websocket is dropped.
func normalizeRequest(req *http.Request) {
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // Request.Write omits an empty one
	}
	if up := req.Header.Get("Upgrade"); up != "" && !strings.EqualFold(strings.TrimSpace(up), "websocket") {
		req.Header.Del("Upgrade")
		req.Header.Del("Http2-Settings")
	}
}

// requestName is the name a request addresses: the target's authority in absolute
// form, else the Host header (http.ReadRequest's req.Host), without a port or a
// trailing dot, normalised.
func requestName(req *http.Request) string {
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return policies.NormalizeName(strings.TrimSuffix(host, "."))
}

// peekAll returns (and consumes) what r has buffered.
func peekAll(r *bufio.Reader) []byte {
	b, _ := r.Peek(r.Buffered())
	out := bytes.Clone(b)
	r.Discard(len(b))
	return out
}

// flushingBody reads a response body and flushes the client writer before a read that
// may block (the upstream reader holds nothing more), so a streamed body is not held
// back in the buffer.
type flushingBody struct {
	r  io.ReadCloser
	ur *bufio.Reader
	cw *bufio.Writer
}

func (b *flushingBody) Read(p []byte) (int, error) {
	if b.ur.Buffered() == 0 && b.cw.Buffered() > 0 {
		if err := b.cw.Flush(); err != nil {
			return 0, err
		}
	}
	return b.r.Read(p)
}

// Close does not close the body: closing drains it, which after a failed write could
// wait on an endless stream; relayResponse closes a body it read to the end.
func (b *flushingBody) Close() error { return nil }

// writeOnly hides bufio.Writer's ReadFrom: io.Copy must not read the body (which
// flushes the writer, see flushingBody) into the writer's own buffer.
type writeOnly struct{ w io.Writer }

func (w writeOnly) Write(p []byte) (int, error) { return w.w.Write(p) }
