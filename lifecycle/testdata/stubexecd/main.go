// Command stubexecd stands in for execd in lifecycle tests while execd is not built:
// it serves GET /ping on :44772 and runs the entrypoint after "--exec --".
package main

import (
	"net/http"
	"os"
	"os/exec"
)

func main() {
	args := os.Args[1:]
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	if len(args) > 0 {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		_ = cmd.Start()
	}
	http.HandleFunc("/ping", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })
	_ = http.ListenAndServe(":44772", nil)
}
