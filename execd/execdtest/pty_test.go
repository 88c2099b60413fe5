package execdtest

import (
	"testing"
	"time"
)

// TestExpectKeepsTheRestOfAFrame: one frame may carry the output of several lines
// (the PTY is read in chunks); an Expect that matches the first keeps the rest for the
// next Expect (TestPTYInSandbox waited 20 s for a line its first Expect had read past).
func TestExpectKeepsTheRestOfAFrame(t *testing.T) {
	c := &PTYClient{Frames: make(chan PTYFrame, 2)}
	c.Frames <- PTYFrame{Type: "stdout", Data: []byte("/tmp/pty-work\r\n/dev/pts/0\r\nterm=xterm-256c")}
	c.Frames <- PTYFrame{Type: "stdout", Data: []byte("olor\r\n# ")}
	if got := c.Expect(t, "/tmp/pty-work", time.Second); got != "/tmp/pty-work" {
		t.Fatalf("first Expect returned %q", got)
	}
	if got := c.Expect(t, "term=xterm-256color", time.Second); got != "\r\n/dev/pts/0\r\nterm=xterm-256color" {
		t.Fatalf("second Expect returned %q", got)
	}
	if got := c.Expect(t, "# ", time.Second); got != "\r\n# " {
		t.Fatalf("third Expect returned %q", got)
	}
	if c.Out.String() != "/tmp/pty-work\r\n/dev/pts/0\r\nterm=xterm-256color\r\n# " {
		t.Fatalf("Out %q", c.Out.String())
	}
}
