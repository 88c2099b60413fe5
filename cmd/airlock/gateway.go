package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/gateway"
	"github.com/airlockdev/airlock/gateway/accesstoken"
	"github.com/airlockdev/airlock/gateway/signedurl"
)

func newGatewayCmd() *cobra.Command {
	var (
		listen, watchURL, apiKey, activeKey, renewURL, tlsMode, dataDir string
		egressAPI                                                       string
		metricsListen, auditLog, adminListen, logLevel                  string
		baseDomains, watchHeaders, signingKeys                          []string
		maxConns                                                        int
	)
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run the ingress gateway alone (embedded Caddy with the airlock modules)",
		Long: `Runs Airlock's ingress gateway: an embedded Caddy with the airlock app and handler. It
follows lifecycle's watch stream for the route table and proxies each request to the
sandbox port it names:

  host     <port>-<id>.<base domain>  or  <id>-<port>.<base domain>
  header   OpenSandbox-Ingress-To: <id>-<port>   (or X-Airlock-Sandbox + X-Airlock-Port)
  path     /sandboxes/<id>/proxy/<port>/...  or  /<id>/<port>/...

Signed routes (<port>-<id>-<expiry>-<tag>) are verified with the signing keys that
lifecycle mints with. Use this command to run the gateway as its own process (one
Deployment on Kubernetes); 'airlock up' runs the same gateway inside the all-in-one
process. A stock Caddy can load the same modules instead (see gateway/README.md).

Secrets can come from the environment: OPEN_SANDBOX_API_KEY (--api-key, sent to
lifecycle for the watch and renew intents, and admitted like a sandbox's access token
on execd 44772, the egress API 18080 and other token ports) and AIRLOCK_SIGNING_KEYS
(comma-separated --signing-key values).`,
		Example: `  airlock gateway --watch-url http://127.0.0.1:8080/internal/v1/watch \
      --signing-key a=base64:$(head -c32 /dev/urandom | base64) \
      --renew-url 'http://127.0.0.1:8080/v1/sandboxes/{id}/renew-expiration'
  curl -H 'OpenSandbox-Ingress-To: <id>-8080' http://127.0.0.1:8081/`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: parseLevel(logLevel)}))
			if apiKey == "" {
				apiKey = os.Getenv("OPEN_SANDBOX_API_KEY")
			}
			if len(signingKeys) == 0 {
				if env := os.Getenv("AIRLOCK_SIGNING_KEYS"); env != "" {
					signingKeys = strings.Split(env, ",")
				}
			}
			cfg := gateway.Config{
				Listen:             listen,
				BaseDomains:        nonEmpty(baseDomains),
				WatchURL:           watchURL,
				ActiveKey:          activeKey,
				MaxConnsPerSandbox: maxConns,
				RenewURL:           renewURL,
				EgressAPIDial:      egressAPI,
				TLS:                gateway.TLSMode(tlsMode),
				DataDir:            dataDir,
				AdminListen:        adminListen,
				Log:                log,
			}
			hdr, err := parseHeaders(watchHeaders)
			if err != nil {
				return err
			}
			if apiKey != "" {
				hdr.Set("OPEN-SANDBOX-API-KEY", apiKey)
				cfg.RenewHeader = http.Header{"Open-Sandbox-Api-Key": {apiKey}}
				cfg.EgressAPIHeader = cfg.RenewHeader
				// Requests carrying the API key are admitted on token ports; the gateway
				// keeps only its SHA-256.
				cfg.APIKeySHA256 = accesstoken.Sum(apiKey).String()
			}
			cfg.WatchHeader = hdr
			for _, s := range signingKeys {
				k, err := signedurl.ParseKey(strings.TrimSpace(s))
				if err != nil {
					return err
				}
				cfg.SigningKeys = append(cfg.SigningKeys, k)
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			cfg.Metrics = reg
			if auditLog != "" {
				sink, closeSink, err := openJSONLinesAudit(auditLog)
				if err != nil {
					return err
				}
				defer closeSink()
				cfg.Audit = sink
			}

			srv, err := gateway.NewServer(cfg)
			if err != nil {
				return err
			}
			if err := srv.Start(); err != nil {
				return err
			}
			defer srv.Close()
			fmt.Fprintf(cmd.OutOrStdout(), "==> gateway listening on %s (base domains %s)\n", srv.Addr(), strings.Join(cfg.BaseDomains, ", "))
			if cfg.TLS == gateway.TLSInternal {
				fmt.Fprintf(cmd.OutOrStdout(), "==> internal CA root certificate: %s\n", srv.RootCertPath())
			}
			if metricsListen != "" {
				mux := http.NewServeMux()
				mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
				defer serveHTTP(metricsListen, mux, log).Close()
				fmt.Fprintf(cmd.OutOrStdout(), "==> metrics on http://%s/metrics\n", metricsListen)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			<-ctx.Done()
			fmt.Fprintln(cmd.OutOrStdout(), "==> gateway stopping")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", gateway.DefaultListen, "address to serve on")
	f.StringSliceVar(&baseDomains, "base-domain", []string{gateway.DefaultBaseDomain}, "base domain for host-form routes (repeatable; \"\" disables host routing)")
	f.StringVar(&watchURL, "watch-url", "", "lifecycle watch stream URL, e.g. http://127.0.0.1:8080/internal/v1/watch")
	f.StringArrayVar(&watchHeaders, "watch-header", nil, "extra header for the watch stream, \"Name: value\" (repeatable)")
	f.StringVar(&apiKey, "api-key", "", "lifecycle API key sent as OPEN-SANDBOX-API-KEY to the watch and renew endpoints and accepted from clients on token ports (default $OPEN_SANDBOX_API_KEY)")
	f.StringArrayVar(&signingKeys, "signing-key", nil, "signed-route key <id>=base64:<secret> or <id>=hex:<secret>, id one of [0-9a-z] (repeatable; default $AIRLOCK_SIGNING_KEYS)")
	f.StringVar(&activeKey, "active-key", "", "id of the key that mints (default: the first)")
	f.IntVar(&maxConns, "max-conns-per-sandbox", 0, "requests and streams in flight per sandbox (0: 1024, negative: no cap)")
	f.StringVar(&renewURL, "renew-url", "", "renew-on-access endpoint with {id}, e.g. http://127.0.0.1:8080/v1/sandboxes/{id}/renew-expiration (empty: off)")
	f.StringVar(&egressAPI, "egress-api", "", "lifecycle host:port that answers sandbox port 18080 (the OpenSandbox egress API /policy), e.g. 127.0.0.1:8080 (empty: port 18080 is proxied to the sandbox)")
	f.StringVar(&tlsMode, "tls", "", "TLS mode: \"\" (plain HTTP and h2c) or \"internal\" (local CA for *.<base domain>)")
	f.StringVar(&dataDir, "data-dir", "", "Caddy storage for certificates and the internal CA (default Caddy's data dir)")
	f.StringVar(&metricsListen, "metrics-listen", "", "serve Prometheus /metrics on this address (empty: off)")
	f.StringVar(&auditLog, "audit-log", "", "append one JSON audit record per request to this file (\"-\" for stdout; empty: off)")
	f.StringVar(&adminListen, "admin-listen", "", "enable Caddy's admin API on this address (empty: off)")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return cmd
}

func nonEmpty(in []string) []string {
	out := []string{}
	for _, s := range in {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

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

func parseLevel(s string) slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return slog.LevelInfo
	}
	return l
}

// jsonLinesAudit writes audit records as JSON lines; a stand-in for the hash-chained
// audit writer when the gateway runs alone.
type jsonLinesAudit struct {
	mu  sync.Mutex
	enc *json.Encoder
	seq uint64
}

func (j *jsonLinesAudit) Append(r audit.Record) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.seq++
	r.Seq = j.seq
	_ = j.enc.Encode(r)
}

func openJSONLinesAudit(path string) (*jsonLinesAudit, func(), error) {
	var w io.WriteCloser = os.Stdout
	closeFn := func() {}
	if path != "-" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
		if err != nil {
			return nil, nil, err
		}
		w, closeFn = f, func() { f.Close() }
	}
	return &jsonLinesAudit{enc: json.NewEncoder(w)}, closeFn, nil
}

// serveHTTP serves h on addr in the background (metrics, health) until Close; a
// serving error is logged.
func serveHTTP(addr string, h http.Handler, log *slog.Logger) *http.Server {
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http listener failed", "addr", addr, "error", err)
		}
	}()
	return srv
}
