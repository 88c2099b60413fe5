package stack

import (
	"net/http"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/console"
	"github.com/airlockdev/airlock/policies"
)

// ConsoleConfig configures the operator console (package console), served under
// /console/ on the API listener.
type ConsoleConfig struct {
	// Disabled turns the console off (/console/ is then the API's 404).
	Disabled bool `yaml:"disabled"`
	// SessionTTL is how long a console sign-in lasts; default 12h.
	SessionTTL Duration `yaml:"sessionTTL"`
	// TrustedOrigins are extra origins whose writes the console accepts besides its
	// own ("https://airlock.example.com" when a TLS proxy fronts the API).
	TrustedOrigins []string `yaml:"trustedOrigins"`
}

// apiHandler is the API listener's handler: the console under /console/ (when enabled)
// in front of lifecycle's API. closeFn ends the console's live streams (for Shutdown).
func (s *Stack) apiHandler() (h http.Handler, closeFn func(), err error) {
	api := s.Lifecycle.Handler()
	if s.cfg.Console.Disabled {
		return api, func() {}, nil
	}
	ov := policies.BaseOverlay()
	if !s.cfg.Egress.Disabled {
		if ov, err = s.egressConfig().Overlay(); err != nil { // as egressd compiles policies
			return nil, nil, err
		}
	}
	scheme := "http"
	if s.cfg.Gateway.TLS != "" && !s.cfg.Gateway.Disabled {
		scheme = "https"
	}
	var signIns interface{ Append(audit.Record) } // sign-in records, when the stack audits
	if s.Audit != nil {
		signIns = s.Audit
	}
	con, err := console.New(console.Config{
		API:            api,
		APIKey:         s.APIKey,
		Authenticate:   s.Lifecycle.Keys().Authenticate,
		AuditDir:       s.cfg.Audit.Dir,
		Audit:          signIns,
		Overlay:        ov,
		SessionTTL:     time.Duration(s.cfg.Console.SessionTTL),
		EndpointScheme: scheme,
		TrustedOrigins: s.cfg.Console.TrustedOrigins,
		GatewayDomain:  consoleGatewayDomain(s.cfg.Gateway),
		Log:            s.log.With("component", "console"),
	})
	if err != nil {
		return nil, nil, err
	}
	return con.Front(api), con.Close, nil
}

// consoleGatewayDomain is the domain the console embeds a desktop sandbox's noVNC page
// under: the host-form endpoints' domain, "" when the gateway is off.
func consoleGatewayDomain(g GatewayConfig) string {
	if g.Disabled {
		return ""
	}
	return endpointDomain(g)
}
