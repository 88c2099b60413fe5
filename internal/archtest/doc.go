// Package archtest holds tests of the module's architecture, read from `go list`: which
// folders may import which (imports_test.go). It has no code of its own.
package archtest
