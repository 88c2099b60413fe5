package cluster

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/airlockdev/airlock/console"
	"github.com/airlockdev/airlock/policies"
	"github.com/airlockdev/airlock/principal"
)

// ConsoleConfig configures the operator console (package console) a replica serves
// under /console/ on its API listener, as `airlock up` does (stack.ConsoleConfig).
//
// On Kubernetes a console session lives in the memory of the replica that signed it
// in: the Service in front of the replicas keeps a browser on one of them
// (sessionAffinity: ClientIP in deploy/kubernetes), and a replica that restarts signs
// its sessions out. Sign-ins, failed or not, are control records in the replica's
// audit log (Config.Audit; none: only logged). There are no audit pages: the audit is
// spread over each node's egressd, the gateways and every lifecycle replica, each a
// chain of its own, so the console's audit routes answer 501 (after the role check: a
// key that may not read the audit still gets 403).
type ConsoleConfig struct {
	// Disabled turns the console off (/console/ is then the API's 404); `airlock
	// lifecycle --no-console`. Default on.
	Disabled bool `yaml:"disabled"`
	// SessionTTL is how long a console sign-in lasts; default console.DefaultSessionTTL
	// (12h).
	SessionTTL time.Duration `yaml:"sessionTTL"`
	// TrustedOrigins are extra origins ("https://airlock.example.com") whose writes the
	// console accepts besides the request's own: an Ingress terminating TLS in front of
	// the replicas, whose requests arrive over plain HTTP.
	TrustedOrigins []string `yaml:"trustedOrigins"`
}

// apiHandler is the API listener's handler: the console under console.Prefix (unless
// cfg.Console.Disabled) in front of api, the lifecycle handler; authenticate is the
// key store's (lifecycle.Server.Keys().Authenticate). closeFn ends the console's live
// streams (register it with the http.Server's RegisterOnShutdown).
func apiHandler(cfg Config, api http.Handler, authenticate func(string) (principal.Principal, bool)) (h http.Handler, closeFn func(), err error) {
	if cfg.Console.Disabled {
		return api, func() {}, nil
	}
	// The overlay egressd compiles the sandboxes' policies under on the nodes: the base
	// and the cluster's own ranges (egressd's --deny, which the manifests give lifecycle
	// too). egressd adds its node's addresses, which this replica does not know.
	ov := policies.BaseOverlay()
	for _, p := range cfg.Deny {
		if err := ov.Deny(p.String()); err != nil {
			return nil, nil, fmt.Errorf("cluster: console overlay: deny %s: %w", p, err)
		}
	}
	domain := "" // a desktop's noVNC page is embedded from the gateway's host form
	if cfg.Gateway != "" {
		domain = cfg.BaseDomain
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	con, err := console.New(console.Config{
		API:            api,
		APIKey:         cfg.APIKey,
		Authenticate:   authenticate,
		AuditDir:       "", // no audit pages on Kubernetes (ConsoleConfig)
		Audit:          cfg.Audit,
		Overlay:        ov,
		SessionTTL:     cfg.Console.SessionTTL,
		EndpointScheme: "http",
		TrustedOrigins: cfg.Console.TrustedOrigins,
		GatewayDomain:  domain,
		Log:            log.With("component", "console"),
	})
	if err != nil {
		return nil, nil, err
	}
	return con.Front(api), con.Close, nil
}
