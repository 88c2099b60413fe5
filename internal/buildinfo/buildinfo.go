// Package buildinfo carries the version stamped into Airlock's binaries.
package buildinfo

// Version is Airlock's version; `make` sets it with
// -ldflags "-X github.com/airlockdev/airlock/internal/buildinfo.Version=<v>".
var Version = "0.1.0-dev"
