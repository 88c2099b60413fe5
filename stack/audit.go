package stack

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/audit/execdaudit"
	"github.com/airlockdev/airlock/audit/ocsf"
)

// AuditConfig configures a hash-chained, signed audit log (package audit): the one log
// `airlock up` shares between its components (airlock.yaml's audit section) or the log
// of a standalone `airlock egressd` or `airlock gateway` (their --audit-* flags).
// Whoever opens it, OpenAudit opens it the same way.
type AuditConfig struct {
	// Dir holds the JSON Lines files and checkpoints.jsonl (created 0700). airlock up:
	// default <stateDir>/audit. A standalone egressd or gateway: empty writes no audit
	// (it says so in its log at start). One writer per directory: two servers on one
	// host need two directories.
	Dir string `yaml:"dir"`
	// SigningKeyFile is the Ed25519 key that signs every checkpoint: one line of
	// base64, the 32-byte seed (`airlock audit keygen`). Default: Dir+".key", beside the
	// directory. Generated (0600) at the first start when the file does not exist; its
	// public key is written beside it (".pub" for ".key", 0644) when missing. `airlock
	// audit verify DIR` checks signatures with DIR.pub by default.
	SigningKeyFile string `yaml:"signingKeyFile"`
	// MaxFileBytes is the size, in bytes, at which a log file is sealed by a signed
	// checkpoint and the next one begun; default audit.DefaultMaxFileBytes (64 MiB).
	MaxFileBytes int64 `yaml:"maxFileBytes"`
	// RateLimit bounds the records per sandbox and source, and the gateway's refusals
	// per client address (audit.RateLimit: rate, burst, refusalRate, refusalBurst);
	// what goes over is counted in `suppressed` records. Default
	// audit.DefaultRateLimit (100/s, burst 1000; refusals 20/s, burst 100); a negative
	// rate means no limit.
	RateLimit audit.RateLimit `yaml:"rateLimit"`
	// Retention deletes the oldest finished log files while the files exceed maxBytes
	// or once their last record is older than maxAge. Default 10 GiB and 90 days
	// (audit.DefaultRetention); a negative value means no limit of that kind.
	Retention AuditRetention `yaml:"retention"`
	// OCSF is the export of every record as OCSF events (JSON Lines in Dir/ocsf,
	// rotated and retained with the chain: package audit/ocsf); on unless disabled.
	OCSF AuditOCSF `yaml:"ocsf"`
	// Anchors ship a signed digest of every checkpoint and head off the host
	// (audit.Anchor; `airlock audit verify --anchors DIR`). None by default.
	Anchors AuditAnchors `yaml:"anchors"`
	// AgentActions are the records of agent actions through execd (commands, code,
	// sessions, PTYs, file changes), made by the gateway and lifecycle's server proxy
	// (package audit/execdaudit): on unless disabled; hashCommands stores the SHA-256
	// of command text and code instead of the text.
	AgentActions execdaudit.Config `yaml:"agentActions"`
}

// AuditOCSF configures the OCSF export beside the audit log.
type AuditOCSF struct {
	// Disabled turns the export off (airlock.yaml audit.ocsf.disabled: true; the
	// servers' --audit-ocsf=false).
	Disabled bool `yaml:"disabled"`
}

// AuditAnchors are the sinks that receive the audit log's anchors: each signed digest
// names the previous one (CloudTrail's digest chain). Shipping never blocks the log's
// writer: a failure is logged, counted (airlock_audit_anchor_failures_total) and
// retried.
type AuditAnchors struct {
	// Dir is a directory on another mount than the log's: anchors are appended to
	// Dir/anchors.jsonl (fsync'd). One directory per audit log.
	Dir string `yaml:"dir"`
	// URL receives each anchor as a JSON POST (any 2xx stores it); a GET returns the
	// last anchor it holds (404 or 204: none), so a restart continues the chain.
	URL string `yaml:"url"`
}

// sinks are the audit.AnchorSink of a.
func (a AuditAnchors) sinks() []audit.AnchorSink {
	var out []audit.AnchorSink
	if a.Dir != "" {
		out = append(out, audit.DirSink{Dir: a.Dir})
	}
	if a.URL != "" {
		out = append(out, audit.HTTPSink{URL: a.URL})
	}
	return out
}

// AuditRetention is audit.Retention as written in airlock.yaml.
type AuditRetention struct {
	// MaxBytes is the most the log files may hold together, in bytes.
	MaxBytes int64 `yaml:"maxBytes"`
	// MaxAge is how old the last record of a finished file may be ("2160h").
	MaxAge Duration `yaml:"maxAge"`
}

// DefaultAuditConfig is every default of the audit log but Dir, which depends on who
// runs it (see AuditConfig.Dir).
func DefaultAuditConfig() AuditConfig {
	r := audit.DefaultRetention()
	return AuditConfig{MaxFileBytes: audit.DefaultMaxFileBytes, RateLimit: audit.DefaultRateLimit(),
		Retention: AuditRetention{MaxBytes: r.MaxBytes, MaxAge: Duration(r.MaxAge)}}
}

// writerLimits are c's rate limit and retention as audit.Config takes them (negative:
// none).
func (c AuditConfig) writerLimits() (audit.RateLimit, audit.Retention) {
	rl := c.RateLimit
	rl.Rate, rl.RefusalRate = max(rl.Rate, 0), max(rl.RefusalRate, 0)
	return rl, audit.Retention{MaxBytes: max(c.Retention.MaxBytes, 0), MaxAge: max(time.Duration(c.Retention.MaxAge), 0)}
}

// KeyFiles are the signing key file and its public key file: SigningKeyFile and the
// .pub beside it, else audit.DefaultKeyFiles(Dir).
func (c AuditConfig) KeyFiles() (priv, pub string) {
	if c.SigningKeyFile != "" {
		return c.SigningKeyFile, audit.PublicKeyFile(c.SigningKeyFile)
	}
	return audit.DefaultKeyFiles(c.Dir)
}

// resolved fills what is empty from DefaultAuditConfig and checks the result.
func (c AuditConfig) resolved() (AuditConfig, error) {
	if c.MaxFileBytes == 0 {
		c.MaxFileBytes = DefaultAuditConfig().MaxFileBytes
	}
	if c.RateLimit == (audit.RateLimit{}) {
		c.RateLimit = DefaultAuditConfig().RateLimit
	}
	if c.Retention == (AuditRetention{}) {
		c.Retention = DefaultAuditConfig().Retention
	}
	if c.MaxFileBytes < 0 {
		return c, fmt.Errorf("config: audit.maxFileBytes %d: want a size in bytes", c.MaxFileBytes)
	}
	if u := c.Anchors.URL; u != "" && !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		return c, fmt.Errorf("config: audit.anchors.url %q: want an http:// or https:// URL", u)
	}
	return c, nil
}

// OpenAudit opens the audit log of c (c.Dir must be set): its signing key loaded, or
// generated with its public key at the first start (AuditConfig.SigningKeyFile), and
// the writer started with every checkpoint signed and, unless c.OCSF.Disabled, the
// OCSF export beside it (Dir/ocsf). reg receives the airlock_audit_*
// metrics (nil: none). The caller closes the writer.
func OpenAudit(c AuditConfig, reg prometheus.Registerer, log *slog.Logger) (*audit.Writer, error) {
	c, err := c.resolved()
	if err != nil {
		return nil, err
	}
	if c.Dir == "" {
		return nil, fmt.Errorf("audit: no directory")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	privPath, pubPath := c.KeyFiles()
	key, created, err := audit.LoadOrCreateSigningKey(privPath, pubPath)
	if err != nil {
		return nil, fmt.Errorf("audit signing key: %w", err)
	}
	if created {
		log.Info("audit signing key generated", "key", privPath, "public_key", pubPath)
	}
	rl, ret := c.writerLimits()
	var sink audit.Sink
	if !c.OCSF.Disabled {
		ex, err := ocsf.New(ocsf.Config{ChainDir: c.Dir, Logger: log})
		if err != nil {
			return nil, err
		}
		sink = ex
	}
	w, err := audit.New(audit.Config{
		Dir:          c.Dir,
		MaxFileBytes: c.MaxFileBytes,
		RateLimit:    rl,
		Retention:    ret,
		SigningKey:   key,
		Logger:       log,
		Registry:     reg,
		Sink:         sink,
		Anchors:      c.Anchors.sinks(),
	})
	if err != nil && sink != nil {
		sink.Close()
	}
	return w, err
}

// startAudit opens the audit log every component writes to (StateDir/audit by default).
func (s *Stack) startAudit(context.Context) error {
	w, err := OpenAudit(s.cfg.Audit, s.registry, s.log.With("component", "audit"))
	if err != nil {
		return err
	}
	s.Audit = w
	return nil
}

// AuditDir is the directory of the audit log.
func (s *Stack) AuditDir() string { return s.cfg.Audit.Dir }
