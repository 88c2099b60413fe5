package execd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// forwarded are the signals PID 1 mode passes on to the child.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH}

// SuperviseConfig configures Supervise.
type SuperviseConfig struct {
	// Argv is the child's command line; Argv[0] is looked up in PATH. No shell is used.
	Argv []string
	// Procs is the process tracker shared with the Server (so the reaper leaves the
	// Server's own children alone).
	Procs *Procs
	// Logger receives supervision logs; slog.Default() when nil.
	Logger *slog.Logger
}

// Supervise runs the container's real entrypoint as execd's child, the way an init
// process does: it forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 and
// SIGWINCH to the child, reaps every orphan re-parented to execd (as PID 1, or as a
// child subreaper otherwise), and returns the child's exit status once it ended
// (128+signal when a signal killed it). Cancelling ctx sends the child SIGTERM.
// The child inherits execd's stdin, stdout, stderr and environment.
func Supervise(ctx context.Context, cfg SuperviseConfig) (int, error) {
	if len(cfg.Argv) == 0 {
		return 0, errors.New("execd: no command to supervise")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Procs == nil {
		cfg.Procs = &Procs{}
	}
	if os.Getpid() != 1 {
		// Orphans of the child come to execd instead of the real init.
		const prSetChildSubreaper = 36
		syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, append([]os.Signal{syscall.SIGCHLD}, forwarded...)...)
	defer signal.Stop(sigs)

	cmd := exec.Command(cfg.Argv[0], cfg.Argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cfg.Procs.Start(cmd); err != nil {
		return 127, fmt.Errorf("execd: starting %q: %w", cfg.Argv[0], err)
	}
	cfg.Logger.Info("child started", "pid", cmd.Process.Pid, "argv", cfg.Argv)
	waited := make(chan error, 1)
	go func() { waited <- cfg.Procs.Wait(cmd) }()
	done := ctx.Done()
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGCHLD {
				cfg.Procs.ReapOrphans()
				continue
			}
			cfg.Logger.Debug("forwarding signal", "signal", sig.String())
			cmd.Process.Signal(sig)
		case <-done:
			done = nil
			cmd.Process.Signal(syscall.SIGTERM)
		case err := <-waited:
			cfg.Procs.ReapOrphans()
			code := exitStatus(cmd.ProcessState)
			cfg.Logger.Info("child exited", "pid", cmd.Process.Pid, "exit_code", code)
			var exitErr *exec.ExitError
			if err != nil && !errors.As(err, &exitErr) {
				return code, err
			}
			return code, nil
		}
	}
}

// exitStatus is the shell convention: the exit code, or 128+signal.
func exitStatus(ps *os.ProcessState) int {
	if ps == nil {
		return 1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
