// Package otlp ships the audit log to OpenTelemetry: every record's OCSF events (package
// audit/ocsf) as OTLP log records, and the OSEP-0010 metrics derived from the same
// records (metrics.go). It is a projection of the hash-chained log, never a replacement:
// it reads the chain files back, so it loses nothing the chain holds, and each log
// record names its chain record (airlock.audit.seq, airlock.audit.hash) so a reader can
// check it against the chain.
//
// Delivery is at least once: a batch is exported, and only then is its last seq written
// to ChainDir/otlp/position; an export that fails is retried (backoff up to
// Config.RetryMax) until it succeeds or the exporter stops, and a restart continues
// after the position. An OTLP receiver may therefore see a record twice after a crash,
// never a gap.
package otlp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otellog "go.opentelemetry.io/otel/log"
	"go.opentelemetry.io/otel/metric"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/audit/ocsf"
)

// DirName is the exporter's directory inside the audit directory (its position file).
const DirName = "otlp"

// ScopeName is the instrumentation scope of the log records and metrics.
const ScopeName = "github.com/airlockdev/airlock/audit/otlp"

// Log record attributes (besides the OSEP-0010 osbx.id, the sandbox).
const (
	AttrSeq      = "airlock.audit.seq"    // int: the chain record's seq
	AttrHash     = "airlock.audit.hash"   // string: the chain record's hash (hex SHA-256)
	AttrSource   = "airlock.audit.source" // string: dns, bpf, l7, gateway, execd, ...
	AttrAction   = "airlock.audit.action" // string: allow, deny, loss, ...
	AttrClassUID = "ocsf.class_uid"       // int: the OCSF class of the body
	AttrSandbox  = "osbx.id"              // string: the sandbox (OSEP-0010 §2)
)

// Config configures an Exporter.
type Config struct {
	// ChainDir is the audit log's directory (audit.Config.Dir).
	ChainDir string
	// Logs receives the log records (otlploghttp.New); nil: no log export.
	Logs sdklog.Exporter
	// Meter receives the OSEP-0010 metrics (metrics.go); nil: none.
	Meter metric.MeterProvider
	// Resource describes this host's Airlock (service.name airlock, ...).
	Resource *resource.Resource
	// Host is the machine's name in the OCSF events; default os.Hostname.
	Host string
	// BatchSize is the most log records per export; default 512.
	BatchSize int
	// Poll is how often the chain is read for new records; default 200ms.
	Poll time.Duration
	// Progress is the writer's count of written records (audit.Writer.Written). With
	// it the exporter yields to the writer, as the OCSF export does: it reads once the
	// writer has written nothing for Quiet (default 250ms) or, under a sustained
	// stream, once the oldest record not read has waited MaxLag (default 2s), so a
	// burst is written at full speed and exported right after. nil: it reads every
	// Poll.
	Progress func() uint64
	// Quiet and MaxLag: see Progress.
	Quiet, MaxLag time.Duration
	// RetryMax caps the backoff between failed exports; default 30s.
	RetryMax time.Duration
	// Logger receives export errors; default slog.Default().
	Logger *slog.Logger
}

// Exporter follows the chain and exports it (package doc). Close stops it.
type Exporter struct {
	cfg     Config
	pos     string // position file
	mapper  ocsf.Mapper
	logger  otellog.Logger
	lp      *sdklog.LoggerProvider
	batch   *collector
	metrics *derived
	started time.Time

	cancel   context.CancelFunc
	done     chan struct{}
	exported atomic.Uint64
	failures atomic.Uint64
}

// New starts the exporter from the position in ChainDir/otlp (the oldest retained
// record when there is none). Errors: an empty ChainDir, neither Logs nor Meter, or an
// unreadable position file.
func New(cfg Config) (*Exporter, error) {
	if cfg.ChainDir == "" {
		return nil, errors.New("otlp: Config.ChainDir is empty")
	}
	if cfg.Logs == nil && cfg.Meter == nil {
		return nil, errors.New("otlp: nothing to export (Config.Logs and Config.Meter are nil)")
	}
	if cfg.Host == "" {
		cfg.Host, _ = os.Hostname()
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 512
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 200 * time.Millisecond
	}
	if cfg.Quiet <= 0 {
		cfg.Quiet = 250 * time.Millisecond
	}
	if cfg.MaxLag <= 0 {
		cfg.MaxLag = 2 * time.Second
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	dir := filepath.Join(cfg.ChainDir, DirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("otlp: %w", err)
	}
	e := &Exporter{cfg: cfg, pos: filepath.Join(dir, "position"), mapper: ocsf.Mapper{Host: cfg.Host},
		batch: &collector{}, started: time.Now(), done: make(chan struct{})}
	from, err := e.readPosition()
	if err != nil {
		return nil, err
	}
	e.exported.Store(from)
	if cfg.Logs != nil {
		opts := []sdklog.LoggerProviderOption{sdklog.WithProcessor(e.batch)}
		if cfg.Resource != nil {
			opts = append(opts, sdklog.WithResource(cfg.Resource))
		}
		e.lp = sdklog.NewLoggerProvider(opts...)
		e.logger = e.lp.Logger(ScopeName)
	}
	if cfg.Meter != nil {
		if e.metrics, err = newDerived(cfg.Meter.Meter(ScopeName)); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go e.run(ctx, from)
	return e, nil
}

// Exported is the seq of the last record whose log records were exported (or, without
// log export, whose metrics were taken).
func (e *Exporter) Exported() uint64 { return e.exported.Load() }

// Failures counts failed export attempts (each retried).
func (e *Exporter) Failures() uint64 { return e.failures.Load() }

// Close stops following the chain; a batch not yet exported is tried once more with
// a 5 s limit (what it misses, the next start exports).
func (e *Exporter) Close() error {
	e.cancel()
	<-e.done
	if e.lp == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(e.lp.Shutdown(ctx), e.cfg.Logs.Shutdown(ctx))
}

func (e *Exporter) run(ctx context.Context, from uint64) {
	defer close(e.done)
	fl, err := audit.NewFollower(e.cfg.ChainDir, audit.Filter{AfterSeq: from, FromStart: true})
	if err != nil {
		e.cfg.Logger.Error("otlp: reading the audit log", "err", err)
		return
	}
	tick := time.NewTicker(e.cfg.Poll)
	defer tick.Stop()
	last := from // seq of the newest record taken
	var progress uint64
	// changed: when progress last moved; behind: since when the writer has written
	// records not read yet (zero: none), what MaxLag counts from
	var changed, behind time.Time
	for {
		select {
		case <-ctx.Done():
			if last > e.exported.Load() {
				e.export(context.Background(), last, true)
			}
			return
		case <-tick.C:
		}
		now := time.Now()
		if p := e.cfg.Progress; p != nil {
			if v := p(); v != progress {
				progress, changed = v, now
				if behind.IsZero() && v > last {
					behind = now
				}
			}
			if now.Sub(changed) < e.cfg.Quiet && now.Sub(behind) < e.cfg.MaxLag {
				continue // the writer is busy: yield to it
			}
		}
		err := fl.Read(func(r audit.Record) error {
			e.take(ctx, &r)
			last = r.Seq
			if e.batch.len() >= e.cfg.BatchSize {
				e.export(ctx, last, false)
			}
			return ctx.Err()
		})
		if err != nil && ctx.Err() == nil {
			e.cfg.Logger.Error("otlp: reading the audit log", "err", err)
		}
		if last > e.exported.Load() && ctx.Err() == nil {
			e.export(ctx, last, false)
		}
		behind = time.Time{}
		if last < progress {
			behind = now // written meanwhile: the next read is at most MaxLag away
		}
	}
}

// take turns r into log records (one per OCSF event) in the batch and into metrics.
func (e *Exporter) take(ctx context.Context, r *audit.Record) {
	if e.metrics != nil && !r.Time.Before(e.started) {
		e.metrics.observe(ctx, r)
	}
	if e.logger == nil {
		return
	}
	events := e.mapper.Append(nil, r)
	for line := range bytes.SplitSeq(bytes.TrimSuffix(events, []byte("\n")), []byte("\n")) {
		var rec otellog.Record
		rec.SetTimestamp(r.Time)
		rec.SetObservedTimestamp(time.Now())
		rec.SetEventName("airlock.audit." + string(r.Source))
		sev, text := otellog.SeverityInfo, "INFO"
		if r.Action == "deny" || r.Action == audit.ActionLoss {
			sev, text = otellog.SeverityWarn, "WARN"
		}
		rec.SetSeverity(sev)
		rec.SetSeverityText(text)
		rec.SetBody(attribute.StringValue(string(line)))
		rec.AddAttributes(
			attribute.Int64(AttrSeq, int64(r.Seq)),
			attribute.String(AttrHash, r.Hash),
			attribute.String(AttrSource, string(r.Source)),
			attribute.String(AttrAction, r.Action),
			attribute.Int64(AttrClassUID, classUID(line)),
		)
		if r.SandboxID != "" {
			rec.AddAttributes(attribute.String(AttrSandbox, r.SandboxID))
		}
		e.logger.Emit(ctx, rec)
	}
}

// export sends the batch, retrying with backoff until it succeeds or ctx ends (final:
// one try), then records last as the position.
func (e *Exporter) export(ctx context.Context, last uint64, final bool) {
	if e.cfg.Logs != nil {
		recs := e.batch.take()
		wait := 250 * time.Millisecond
		for {
			tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := e.cfg.Logs.Export(tctx, recs)
			cancel()
			if err == nil {
				e.batch.clear()
				break
			}
			e.failures.Add(1)
			e.cfg.Logger.Warn("otlp: log export failed; retrying", "err", err, "records", len(recs), "retry_in", wait)
			if final {
				return
			}
			select {
			case <-ctx.Done():
				return // not recorded: the next start exports these again
			case <-time.After(wait):
			}
			wait = min(wait*2, e.cfg.RetryMax)
		}
	}
	e.exported.Store(last)
	if err := e.writePosition(last); err != nil {
		e.cfg.Logger.Error("otlp: writing the position", "err", err)
	}
}

func (e *Exporter) readPosition() (uint64, error) {
	b, err := os.ReadFile(e.pos)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("otlp: %w", err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("otlp: %s: not a seq: %w", e.pos, err)
	}
	return n, nil
}

func (e *Exporter) writePosition(seq uint64) error {
	tmp := e.pos + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatUint(seq, 10)+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, e.pos)
}

// classUID reads "class_uid" from an OCSF event line (0 if absent).
func classUID(line []byte) int64 {
	const key = `"class_uid":`
	i := bytes.Index(line, []byte(key))
	if i < 0 {
		return 0
	}
	rest := line[i+len(key):]
	j := bytes.IndexAny(rest, ",}")
	if j < 0 {
		return 0
	}
	n, _ := strconv.ParseInt(string(bytes.TrimSpace(rest[:j])), 10, 64)
	return n
}

// collector is the LoggerProvider's processor: it keeps each emitted record (with the
// provider's resource and scope) for the exporter's own batching and retries, which
// the SDK's BatchProcessor does not do (it drops what does not fit its queue).
type collector struct {
	mu   sync.Mutex
	recs []sdklog.Record
}

func (c *collector) OnEmit(_ context.Context, r *sdklog.Record) error {
	c.mu.Lock()
	c.recs = append(c.recs, r.Clone())
	c.mu.Unlock()
	return nil
}

func (c *collector) Enabled(context.Context, sdklog.EnabledParameters) bool { return true }
func (c *collector) Shutdown(context.Context) error                         { return nil }
func (c *collector) ForceFlush(context.Context) error                       { return nil }

func (c *collector) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.recs)
}

// take returns the batch kept so far; it stays kept (for a retry) until clear.
func (c *collector) take() []sdklog.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.recs
}

func (c *collector) clear() {
	c.mu.Lock()
	c.recs = c.recs[:0:0]
	c.mu.Unlock()
}
