package stack

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/execd"
	"github.com/airlockdev/airlock/execd/execdtest"
	"github.com/airlockdev/airlock/internal/benchreport"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/lifecycle"
	"github.com/airlockdev/airlock/opensandbox"
)

// keystrokeOp returns one keystroke round trip on a PTY session at bash's prompt: it
// types "x" and waits for readline's echo of it, or types DEL and waits for the erase
// ("\b \b"), alternately, so the line stays short.
func keystrokeOp(p *execdtest.PTYClient, t *testing.T) func() error {
	typed := false
	return func() error {
		key, want := "x", "x"
		if typed {
			key, want = "\x7f", "\b"
		}
		typed = !typed
		p.Stdin(t, key)
		var got strings.Builder
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(got.String(), want) {
			f := p.Next(time.Until(deadline))
			switch f.Type {
			case "stdout", "replay":
				got.Write(f.Data)
			default:
				return fmt.Errorf("keystroke %q: frame %s (%v) after %q", key, f.Type, f.Err, got.String())
			}
		}
		return nil
	}
}

// TestBenchPTYEcho measures the round trip of a keystroke on a PTY session (typed on the
// WebSocket, echoed by bash's readline, read back) through the gateway of a real
// `airlock up`, next to the same on execd's address directly, in the same run. Target:
// p50 through the gateway ≤ 2 ms on loopback.
func TestBenchPTYEcho(t *testing.T) {
	testenv.NeedBench(t)
	s := accessStack(t, "", false)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sb, ep := ptySandbox(ctx, t, s)
	hdr := http.Header{opensandbox.HeaderExecdAccessToken: {ep.Headers[lifecycle.ExecdTokenHeader]}}
	insts, err := s.Docker.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	direct := ""
	for _, in := range insts {
		if in.SandboxID == sb.ID {
			direct = net.JoinHostPort(in.Address.String(), strconv.Itoa(opensandbox.ExecdPort))
		}
	}
	if direct == "" {
		t.Fatalf("sandbox %s has no address", sb.ID)
	}

	const suite = "pty"
	routes := []ptyRoute{
		{name: "keystroke_echo_direct", base: "http://" + direct, hdr: hdr},
		{name: "keystroke_echo_gateway", base: "http://" + ep.Endpoint, hdr: hdr},
	}
	ops := make([]func() error, len(routes))
	for i, r := range routes {
		id := r.create(t, execd.CreatePTYRequest{})
		p := r.dial(t, id, "")
		p.WaitFor(t, "connected", ptyWait)
		p.Stdin(t, "PS1='$ '\n")
		p.Expect(t, "$ ", ptyWait)
		ops[i] = keystrokeOp(p, t)
		for range 200 { // warm up
			if err := ops[i](); err != nil {
				t.Fatal(err)
			}
		}
	}
	const n, rounds = 500, 4
	samples := make([]benchreport.Sample, len(routes))
	for r := range rounds { // interleaved, alternating the order
		for k := range routes {
			i := k
			if r%2 == 1 {
				i = len(routes) - 1 - k
			}
			smp, err := benchreport.Measure(routes[i].name, n, ops[i])
			if err != nil {
				t.Fatal(err)
			}
			samples[i].Name = smp.Name
			samples[i].Latencies = append(samples[i].Latencies, smp.Latencies...)
			samples[i].Wall += smp.Wall
		}
	}
	for _, smp := range samples {
		benchreport.Print(suite, smp)
	}
	gw := samples[1].Quantile(0.5)
	benchreport.Ratio(suite, "keystroke_echo_gateway_p50_ms", float64(gw)/float64(time.Millisecond), "≤", 2)
	benchreport.Ratio(suite, "keystroke_echo_p50_gateway_over_direct", float64(gw)/float64(samples[0].Quantile(0.5)), "≤", 0)
}
