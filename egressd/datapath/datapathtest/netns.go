// Package datapathtest builds the network-namespace topology the datapath tests run
// traffic through: a "sandbox" namespace behind a veth whose host side is a port of a
// bridge in a "host" namespace, and an "internet" namespace routed from the host that
// holds the servers the sandbox tries to reach. Everything lives in namespaces the test
// creates and removes; no packet leaves them.
//
//	sandbox (10.77.0.2, fd77::2) ─eth0══alh0─ [alb0 bridge 10.77.0.1, fd77::1] host
//	host ─ali0══eth0─ internet (10.88.0.2; servers on 198.18.x.1 and 2001:db8:x::1)
package datapathtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// IP runs the ip tool and fails the test on error.
func IP(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// Netns is a named network namespace created by a test.
type Netns struct{ Name string }

// Path is the namespace's bind mount, usable as a Config.NetNS.
func (n Netns) Path() string { return "/var/run/netns/" + n.Name }

// NewNetns creates a namespace with a unique name (prefix + random) with lo up, and
// removes it at cleanup.
func NewNetns(t testing.TB, prefix string) Netns {
	t.Helper()
	var b [3]byte
	_, _ = rand.Read(b[:])
	n := Netns{Name: prefix + hex.EncodeToString(b[:])}
	IP(t, "netns", "add", n.Name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", n.Name).Run() })
	IP(t, "-n", n.Name, "link", "set", "lo", "up")
	return n
}

// Do runs fn on an OS thread inside the namespace; sockets fn creates stay in it and
// can be used from any goroutine afterwards. The thread is discarded afterwards.
func (n Netns) Do(fn func() error) error {
	res := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		f, err := os.Open(n.Path())
		if err != nil {
			res <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			res <- fmt.Errorf("setns %s: %w", n.Name, err)
			return
		}
		res <- fn()
	}()
	return <-res
}

// Sysctl writes a /proc/sys value inside the namespace.
func (n Netns) Sysctl(t testing.TB, key, value string) {
	t.Helper()
	err := n.Do(func() error {
		return os.WriteFile("/proc/sys/"+strings.ReplaceAll(key, ".", "/"), []byte(value), 0o644)
	})
	if err != nil {
		t.Fatalf("sysctl %s in %s: %v", key, n.Name, err)
	}
}

// Dial connects from inside the namespace.
func (n Netns) Dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		var err error
		c, err = net.DialTimeout(network, addr, timeout)
		return err
	})
	return c, err
}

// Listen opens a listener inside the namespace.
func (n Netns) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// ListenPacket opens a packet listener inside the namespace.
func (n Netns) ListenPacket(network, addr string) (net.PacketConn, error) {
	var l net.PacketConn
	err := n.Do(func() error {
		var err error
		l, err = net.ListenPacket(network, addr)
		return err
	})
	return l, err
}

// Exchange sends a UDP datagram from inside the namespace and waits for one answer.
func (n Netns) Exchange(addr string, timeout time.Duration) error {
	c, err := n.Dial("udp", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 64)
	_, err = c.Read(buf)
	return err
}

// Command runs a program inside the namespace (ip netns exec), for child processes.
func (n Netns) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}
