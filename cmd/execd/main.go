// Command execd is the execution daemon inside every sandbox (see package execd). It
// serves the OpenSandbox execd API on port 44772 and, with --exec, runs as the
// container's PID 1 in front of the real entrypoint.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlockdev/airlock/execd"
	"github.com/airlockdev/airlock/internal/buildinfo"
	"github.com/airlockdev/airlock/opensandbox"
)

const usage = `execd: the Airlock execution daemon (OpenSandbox execd API).

Usage:
  execd [flags]                          serve the API until SIGTERM/SIGINT
  execd [flags] --exec -- CMD [ARG...]   serve the API and run CMD as a child, the way
                                         PID 1 does: signals are forwarded, orphans
                                         reaped, and execd exits with CMD's status.
                                         CMD is run directly (no shell needed).

Flags:
`

func main() {
	fs := flag.NewFlagSet("execd", flag.ContinueOnError)
	port := fs.Int("port", envInt("EXECD_PORT", opensandbox.ExecdPort), "TCP port to serve the API on (env EXECD_PORT)")
	host := fs.String("host", os.Getenv("EXECD_HOST"), "address to listen on; all interfaces when empty (env EXECD_HOST)")
	token := fs.String("access-token", os.Getenv("EXECD_ACCESS_TOKEN"),
		"when set, every request but GET /ping must carry it in X-EXECD-ACCESS-TOKEN (env EXECD_ACCESS_TOKEN)")
	tokenFile := fs.String("access-token-file", os.Getenv("EXECD_ACCESS_TOKEN_FILE"),
		"read the access token from `FILE` and remove the file before anything else starts, so the token lives only in execd's memory "+
			"(the runtimes deliver each sandbox's token this way); execd refuses to serve when the file cannot be read (env EXECD_ACCESS_TOKEN_FILE)")
	tokenSHA := fs.String("access-token-sha256", "",
		"when set (and no token is), every request but GET /ping must carry a token whose SHA-256 is this `HEX` digest: "+
			"the Kubernetes runtime's pods without an init container pass only the digest, never the token")
	logLevel := fs.String("log-level", envOr("EXECD_LOG_LEVEL", "info"), "debug, info, warn or error (env EXECD_LOG_LEVEL)")
	workdir := fs.String("workdir", os.Getenv("EXECD_WORKDIR"),
		"working directory of commands and base of relative paths; /workspace when it exists, else / (env EXECD_WORKDIR)")
	execMode := fs.Bool("exec", false, "run the command after -- as a supervised child (PID 1 mode)")
	hold := fs.Bool("hold", os.Getenv("EXECD_HOLD") == "1",
		"start held: the API answers only GET /ping (others get 503 STARTING) and --exec's command does not start "+
			"until POST "+opensandbox.ReleasePath+" (Airlock's lifecycle server sends it once the sandbox's egress policy is enforced; env EXECD_HOLD=1)")
	maxPTY := fs.Int("max-pty-sessions", envInt("EXECD_MAX_PTY_SESSIONS", 0),
		"at most this many PTY sessions at once (POST /pty past it: 409 PTY_LIMIT_EXCEEDED); 0: the default of "+
			strconv.Itoa(execd.DefaultMaxPTYSessions)+", negative: no limit (env EXECD_MAX_PTY_SESSIONS)")
	version := fs.Bool("version", false, "print the version and exit")
	install := fs.String("install", "", "copy this execd binary to `PATH` (mode 0755) and exit: the Kubernetes runtime's init container delivers execd into the sandbox this way")
	installToken := fs.String("install-token", "", "write the access token ($EXECD_ACCESS_TOKEN) to `FILE` (mode 0444, in a folder the sandbox's execd may remove it from) and exit, after --install when both are given: the Kubernetes runtime's init container delivers each sandbox's token this way, for --access-token-file")
	installTrustDir := fs.String("install-trust", "", "write `DIR`/"+trustBundleName+" (the image's "+systemBundle+" plus the PEM CA certificates in $AIRLOCK_TRUSTED_CA) and DIR/"+trustExtraName+" (the CAs alone), then exit: the Kubernetes runtime's trust init container")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == flag.ErrHelp {
			os.Exit(0)
		}
		os.Exit(2)
	}
	// Commands, sessions, kernels and the entrypoint inherit the environment: the token
	// must not reach them.
	os.Unsetenv("EXECD_ACCESS_TOKEN")
	os.Unsetenv("EXECD_ACCESS_TOKEN_FILE")
	if *version {
		fmt.Println("execd", buildinfo.Version)
		return
	}
	if *installTrustDir != "" {
		if err := installTrust(*installTrustDir, systemBundle, []byte(os.Getenv("AIRLOCK_TRUSTED_CA"))); err != nil {
			fmt.Fprintln(os.Stderr, "execd:", err)
			os.Exit(1)
		}
		return
	}
	if *install != "" || *installToken != "" {
		if *install != "" {
			if err := installSelf(*install); err != nil {
				fmt.Fprintln(os.Stderr, "execd:", err)
				os.Exit(1)
			}
		}
		if *installToken != "" {
			// Readable by any user: the sandbox's execd may run as another user than this
			// init container; it removes the file before anything else starts.
			if strings.TrimSpace(*token) == "" {
				fmt.Fprintln(os.Stderr, "execd: --install-token: $EXECD_ACCESS_TOKEN is empty")
				os.Exit(1)
			}
			if err := writeFile(*installToken, []byte(*token), 0o444); err != nil {
				fmt.Fprintln(os.Stderr, "execd: install-token:", err)
				os.Exit(1)
			}
		}
		return
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "execd: bad --log-level %q\n", *logLevel)
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if *execMode && fs.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "execd: --exec needs a command after --")
		os.Exit(2)
	}
	if !*execMode && fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "execd: unexpected arguments %q (did you mean --exec -- CMD?)\n", fs.Args())
		os.Exit(2)
	}

	var tokenErr error
	if *tokenFile != "" {
		*token, tokenErr = readTokenFile(*tokenFile)
	}
	var digest []byte
	if *tokenSHA != "" && tokenErr == nil {
		if digest, tokenErr = hex.DecodeString(*tokenSHA); tokenErr == nil && len(digest) != sha256.Size {
			tokenErr = fmt.Errorf("--access-token-sha256 has %d bytes, want %d", len(digest), sha256.Size)
		}
	}
	procs := &execd.Procs{}
	var held *execd.Hold
	if *hold {
		held = &execd.Hold{}
	}
	var srv *execd.Server
	err := tokenErr
	if err == nil {
		srv, err = execd.New(execd.Config{
			Hold:              held,
			Addr:              net.JoinHostPort(*host, strconv.Itoa(*port)),
			AccessToken:       *token,
			AccessTokenSHA256: digest,
			Workdir:           *workdir,
			Logger:            logger,
			Procs:             procs,

			MaxPTYSessions: *maxPTY,
		})
	}
	if err != nil {
		// Without its token execd serves nothing (fail closed): a held sandbox then never
		// starts its entrypoint.
		logger.Error("execd configuration", "err", err)
		if !*execMode {
			os.Exit(1)
		}
	}
	if !*execMode {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		if err := srv.Run(ctx); err != nil {
			logger.Error("execd stopped", "err", err)
			os.Exit(1)
		}
		return
	}

	// PID 1 mode: the API is a service next to the user's entrypoint; when it cannot
	// serve, the entrypoint still runs.
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		if srv == nil {
			return
		}
		if err := srv.Run(ctx); err != nil {
			logger.Error("execd API stopped", "err", err)
		}
	}()
	if held != nil { // without an API nobody can release: fail closed
		// Nothing of the user runs before the release; a stop request still ends execd.
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
		select {
		case <-held.Released():
			signal.Stop(sigs)
			logger.Info("released; starting the entrypoint")
		case sig := <-sigs:
			logger.Info("stopped while held; the entrypoint never ran", "signal", sig.String())
			cancel()
			os.Exit(128 + int(sig.(syscall.Signal)))
		}
	}
	argv := fs.Args()
	if held != nil && len(held.Entrypoint()) > 0 {
		argv = held.Entrypoint()
	}
	code, err := execd.Supervise(context.Background(), execd.SuperviseConfig{Argv: argv, Procs: procs, Logger: logger})
	if err != nil {
		logger.Error("supervising the entrypoint", "err", err)
	}
	cancel()
	select {
	case <-served:
	case <-time.After(3 * time.Second):
	}
	os.Exit(code)
}

// readTokenFile returns the token in path (surrounding space trimmed) and removes the
// file, so that nothing started later (the entrypoint, commands) can read it there.
func readTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("access token file: %w", err)
	}
	if err := os.Remove(path); err != nil {
		return "", fmt.Errorf("access token file: removing it: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("access token file %s is empty", path)
	}
	return tok, nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func envInt(key string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(key)); err == nil {
		return n
	}
	return def
}
