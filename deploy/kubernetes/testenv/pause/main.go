// Command pause is the one-node test cluster's sandbox ("pause") image, built by up.sh
// and imported into the node's containerd without a registry. With no arguments it does
// what every pod sandbox's first process does: sleep until SIGTERM or SIGINT, and reap
// the children that the pod's shared PID namespace hands it.
//
// The same static binary is the tests' tiny network tool, so that a test needs no other
// image:
//
//	pause serve <port>                  accept TCP on <port>, write "ok\n" to each client
//	pause probe <host:port> [interval [count]]
//	                                    every interval (default 500ms) dial <host:port>
//	                                    (1 s timeout) and print one line per attempt:
//	                                    "<time> open" when the server answered "ok", else
//	                                    "<time> blocked <reason>"; count attempts (default
//	                                    0: until terminated)
package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	var err error
	switch {
	case len(os.Args) == 1:
		pause()
	case os.Args[1] == "serve" && len(os.Args) == 3:
		err = serve(os.Args[2])
	case os.Args[1] == "probe" && len(os.Args) >= 3 && len(os.Args) <= 5:
		interval, count := 500*time.Millisecond, 0
		if len(os.Args) > 3 {
			if interval, err = time.ParseDuration(os.Args[3]); err != nil {
				break
			}
		}
		if len(os.Args) > 4 {
			if count, err = strconv.Atoi(os.Args[4]); err != nil {
				break
			}
		}
		probe(os.Args[2], interval, count)
	default:
		err = fmt.Errorf("usage: pause | pause serve <port> | pause probe <host:port> [interval [count]]")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pause:", err)
		os.Exit(2)
	}
}

// pause sleeps until SIGTERM or SIGINT and reaps exited children meanwhile.
func pause() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

// serve answers every TCP connection on port with "ok\n".
func serve(port string) error {
	ln, err := net.Listen("tcp", net.JoinHostPort("", port))
	if err != nil {
		return err
	}
	fmt.Println("serving on", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			_, _ = c.Write([]byte("ok\n"))
		}()
	}
}

// probe dials addr every interval and prints the outcome of each attempt, count times
// (0: forever).
func probe(addr string, interval time.Duration, count int) {
	for i := 1; ; i++ {
		fmt.Println(time.Now().UTC().Format(time.RFC3339Nano), attempt(addr))
		if i == count {
			return
		}
		time.Sleep(interval)
	}
}

// attempt reports "open" when addr answered "ok", else "blocked <reason>".
func attempt(addr string) string {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "blocked " + err.Error()
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "ok\n" {
		return fmt.Sprintf("blocked read %q: %v", line, err)
	}
	return "open"
}
