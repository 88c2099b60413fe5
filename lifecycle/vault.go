package lifecycle

import (
	"crypto"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/airlockdev/airlock/policies"
)

// CredentialVault is the egress plane's Credential Vault (OSEP-0012; egressd/vault.Store)
// as lifecycle uses it: the interception CA a credential-proxy sandbox trusts, the
// OpenSandbox egress API's /credential-vault routes (egress-api.yaml), and cleanup. The
// vault holds the secret values; lifecycle never sees them.
type CredentialVault interface {
	// CA returns the sandbox's interception CA, creating it on first use; lifecycle
	// passes only certPEM on (into the sandbox's trust store).
	CA(sandboxID string) (cert *x509.Certificate, key crypto.Signer, certPEM []byte, err error)
	// ServeAPI answers rest ("/credential-vault…") for the sandbox; cover rejects a
	// binding whose destination the sandbox's policy does not allow.
	ServeAPI(w http.ResponseWriter, r *http.Request, sandboxID, rest string, cover func(host string, port uint16) error)
	// Delete forgets the sandbox's vault and CA; idempotent.
	Delete(sandboxID string) error
}

// vaultPrefix is the egress API's Credential Vault path.
const vaultPrefix = "/credential-vault"

// vaultAPI serves the egress API's Credential Vault routes (/credential-vault…, on
// sandbox port 18080 through the server proxy) with the vault that egressd holds: only
// for a sandbox created with credentialProxy.enabled, and only for bindings whose
// destination the sandbox's policy allows by an explicit rule.
type vaultAPI struct {
	vault CredentialVault // nil: the server runs none (every request is 412)
	reg   interface {
		policyReader
		// peek runs fn on the sandbox's record under the registry lock and reports
		// whether the sandbox exists.
		peek(id string, fn func(rec *record)) bool
	}
	log *slog.Logger
}

// serve answers rest ("/credential-vault…") of sandbox id's egress API: 404 for an
// unknown sandbox, 412 when it was not created with credentialProxy.enabled (the proxy
// cannot intercept its traffic), else the vault's own answer.
func (a *vaultAPI) serve(w http.ResponseWriter, r *http.Request, id, rest string) {
	enabled := false
	ok := a.reg.peek(id, func(rec *record) { enabled = rec.CredentialProxy })
	switch {
	case !ok:
		fail(a.log, w, r, fmt.Errorf("%w: %q", ErrNotFound, id))
	case !enabled || a.vault == nil:
		fail(a.log, w, r, fmt.Errorf("%w: sandbox %s was not created with credentialProxy.enabled, so its outbound requests cannot be intercepted", ErrPrecondition, id))
	default:
		a.vault.ServeAPI(w, r, id, rest, func(host string, port uint16) error { return a.covered(id, host, port) })
	}
}

// covered reports (nil) whether the sandbox's policy lets it reach host:port over TCP by
// an explicit egress rule: a binding may only target what the policy allows, never
// something reached by a default allow or in report mode.
func (a *vaultAPI) covered(id, host string, port uint16) error {
	p, _, err := storedPolicy(a.reg, id)
	if err != nil {
		return err
	}
	return policies.CoversBinding(p, host, port)
}

// forgetVault drops the sandbox's vault; failures are logged (the sandbox is gone).
func (s *Server) forgetVault(id string) {
	if s.cfg.CredentialVault == nil {
		return
	}
	if err := s.cfg.CredentialVault.Delete(id); err != nil {
		s.log.Error("deleting the credential vault failed", "sandbox_id", id, "err", err)
	}
}
