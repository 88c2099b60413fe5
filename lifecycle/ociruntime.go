package lifecycle

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// ExtRuntime is the create request's extension choosing the OCI runtime of one sandbox
// by the engine's name for it: {"extensions": {"airlock.dev/runtime": "runsc"}} runs
// it under gVisor. OpenSandbox's CreateSandboxRequest has no field for this (its
// secure runtime, `[secure_runtime]` in the reference server's configuration, is
// server-wide: Airlock's docker.runtime), so it travels in extensions, the field the
// specification keeps for provider-specific parameters. Absent: the server's default.
const ExtRuntime = "airlock.dev/runtime"

// OCIRuntimes is implemented by Runtimes that can run a sandbox under an OCI runtime
// chosen per sandbox (Docker: the runtimes registered with the engine, such as runc
// and runsc). Lifecycle asks it on every create that names one (ExtRuntime).
type OCIRuntimes interface {
	// OCIRuntimes returns the names of the runtimes the engine has, sorted. It asks the
	// engine (I/O, milliseconds).
	OCIRuntimes(ctx context.Context) ([]string, error)
}

// runtimeName is the shape of an engine runtime name (Docker accepts the same).
var runtimeName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

// validateRuntimeExt reads ExtRuntime from a create's extensions into spec (pure: the
// engine is asked in checkRuntime).
func validateRuntimeExt(ext map[string]string, spec *Spec) error {
	name, ok := ext[ExtRuntime]
	if !ok {
		return nil
	}
	if !runtimeName.MatchString(name) {
		return fmt.Errorf("%w: extensions[%q] %q is not a runtime name (for example runsc)", ErrInvalidRequest, ExtRuntime, name)
	}
	spec.OCIRuntime = name
	return nil
}

// checkRuntime refuses (400) a sandbox runtime the engine does not have, or any when
// this server's Runtime cannot choose one per sandbox.
func (s *Server) checkRuntime(ctx context.Context, name string) error {
	if name == "" {
		return nil
	}
	rt, ok := s.rt.(OCIRuntimes)
	if !ok {
		return fmt.Errorf("%w: extensions[%q]: the %s runtime cannot choose an OCI runtime per sandbox", ErrInvalidRequest, ExtRuntime, s.rt.Kind())
	}
	have, err := rt.OCIRuntimes(ctx)
	if err != nil {
		return fmt.Errorf("listing the engine's runtimes: %w", err)
	}
	if !slices.Contains(have, name) {
		return fmt.Errorf("%w: extensions[%q]: the engine has no runtime %q (it has: %s)", ErrInvalidRequest, ExtRuntime, name, strings.Join(have, ", "))
	}
	return nil
}
