// Command upstream serves package testupstream's application; the gateway's integration
// tests build it static (CGO_ENABLED=0) and run it inside sandboxes.
package main

import (
	"flag"
	"log"
	"net"
	"net/http"
	"strings"

	"github.com/airlockdev/airlock/gateway/internal/testupstream"
)

func main() {
	listen := flag.String("listen", ":8080", "comma-separated addresses to serve one application on")
	flag.Parse()
	// Every address is bound before any is served, so a client that reaches one reaches all.
	var lns []net.Listener
	for _, a := range strings.Split(*listen, ",") {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			log.Fatal(err)
		}
		lns = append(lns, ln)
	}
	h := testupstream.Handler()
	for _, ln := range lns[1:] {
		go func() { log.Fatal(http.Serve(ln, h)) }()
	}
	log.Fatal(http.Serve(lns[0], h))
}
