package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/airlockdev/airlock/stack"
)

// Helpers of the flags of the servers that run alone (egressd, gateway, lifecycle):
// the flags fill the component's configuration, whose defaults they show.

// registerAuditFlags adds the --audit-* flags that fill c (stack.AuditConfig: the
// same hash-chained, signed log as airlock up's).
func registerAuditFlags(f *pflag.FlagSet, c *stack.AuditConfig) {
	f.StringVar(&c.Dir, "audit-dir", c.Dir, "directory of the hash-chained, signed audit log, one per server (empty: no audit)")
	f.StringVar(&c.SigningKeyFile, "audit-signing-key", c.SigningKeyFile, "Ed25519 key file that signs the audit checkpoints (default <audit-dir>.key; generated with <audit-dir>.pub at the first start when missing)")
	f.StringVar(&c.Anchors.Dir, "audit-anchors-dir", c.Anchors.Dir, "directory on another mount that receives a signed, chained digest of every audit checkpoint and head (anchors.jsonl; empty: none)")
	f.StringVar(&c.Anchors.URL, "audit-anchors-url", c.Anchors.URL, "URL that receives each signed audit anchor as a JSON POST (empty: none)")
	f.Int64Var(&c.MaxFileBytes, "audit-max-file-bytes", c.MaxFileBytes, "size in bytes at which an audit file is sealed by a signed checkpoint and the next begun")
	f.Var(notValue{&c.OCSF.Disabled}, "audit-ocsf", "export every audit record as OCSF events (JSON Lines in <audit-dir>/ocsf, rotated and retained with the log)")
	f.Lookup("audit-ocsf").NoOptDefVal = "true"
}

// registerAgentActionFlags adds --audit-agent-actions and --audit-hash-commands, which
// fill c.AgentActions: the records of agent actions through execd that a server
// proxying execd (the gateway, lifecycle's server proxy) writes.
func registerAgentActionFlags(f *pflag.FlagSet, c *stack.AuditConfig) {
	f.Var(notValue{&c.AgentActions.Disabled}, "audit-agent-actions", "record agent actions through execd (commands, code, sessions, PTYs, file changes) in the audit log; airlock.yaml audit.agentActions.disabled")
	f.Lookup("audit-agent-actions").NoOptDefVal = "true"
	f.BoolVar(&c.AgentActions.HashCommands, "audit-hash-commands", c.AgentActions.HashCommands, "store the SHA-256 of executed commands and code instead of their text; airlock.yaml audit.agentActions.hashCommands")
}

// notValue is a boolean flag that sets the negation of its value in *b (a flag that
// turns on what a Disabled field turns off).
type notValue struct{ b *bool }

func (v notValue) String() string {
	if v.b == nil {
		return "true"
	}
	return strconv.FormatBool(!*v.b)
}

func (v notValue) Set(s string) error {
	on, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*v.b = !on
	return nil
}

func (v notValue) Type() string { return "bool" }

// addrValue is a flag holding a netip.Addr; empty is the zero (invalid) address.
type addrValue struct{ a *netip.Addr }

func (v addrValue) String() string {
	if v.a == nil || !v.a.IsValid() {
		return ""
	}
	return v.a.String()
}

func (v addrValue) Set(s string) error {
	if s == "" {
		*v.a = netip.Addr{}
		return nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return err
	}
	*v.a = a
	return nil
}

func (v addrValue) Type() string { return "address" }

// parseHeaders parses "Name: value" lines.
func parseHeaders(lines []string) (http.Header, error) {
	h := http.Header{}
	for _, l := range lines {
		name, value, ok := strings.Cut(l, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("header %q: want \"Name: value\"", l)
		}
		h.Add(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	return h, nil
}

// parseLevel is the slog level of s (debug, info, warn, error); info when unknown.
func parseLevel(s string) slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return slog.LevelInfo
	}
	return l
}

// newLogger is a text logger on stderr at level s.
func newLogger(s string) *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: parseLevel(s)}))
}

// envList splits the comma-separated environment variable k; nil when unset or empty.
func envList(k string) []string {
	if v := os.Getenv(k); v != "" {
		return strings.Split(v, ",")
	}
	return nil
}

var _ pflag.Value = addrValue{}
