// Command upstream serves package testupstream's application; the gateway's integration
// tests build it static (CGO_ENABLED=0) and run it inside sandboxes.
package main

import (
	"flag"
	"log"
	"net/http"

	"github.com/airlockdev/airlock/gateway/internal/testupstream"
)

func main() {
	listen := flag.String("listen", ":8080", "address to serve on")
	flag.Parse()
	log.Fatal(http.ListenAndServe(*listen, testupstream.Handler()))
}
