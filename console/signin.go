package console

import (
	"net/http"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
)

// Sign-in records (Config.Audit): control records, as lifecycle writes for API calls
// (lifecycle/control.go), so that one query shows who signed in to the console, who
// tried and failed, and who signed out. OCSF maps them to Authentication (3002).
const (
	opSignIn  = "console.sign_in"
	opSignOut = "console.sign_out"
)

// signInRecord appends the record of a sign-in or sign-out of r: who is the principal
// (zero for a failed or refused sign-in), status the answer's, refusal the reason of
// a failure ("" for a success). Neither the key nor the session id is recorded.
func (c *Console) signInRecord(r *http.Request, op string, who principal.Principal, status int, refusal string) {
	if c.cfg.Audit == nil {
		return
	}
	rec := audit.Record{
		Time:   c.cfg.Now().UTC(),
		Source: audit.SourceControl,
		Proto:  "http",
		Src:    r.RemoteAddr,
		Action: "allow",
		Reason: op + " success",
	}
	if r.TLS != nil {
		rec.Proto = "https"
	}
	x := map[string]any{
		"op":         op,
		"method":     r.Method,
		"path":       r.URL.Path,
		"request_id": r.Header.Get(opensandbox.HeaderRequestID),
		"status":     status,
		"outcome":    "success",
		"entry":      "console",
	}
	if who.ID != "" {
		x["principal"], x["principal_name"], x["role"] = who.ID, who.Name, string(who.Role)
	}
	if refusal != "" {
		rec.Action, rec.Reason, x["outcome"] = "deny", refusal, "failure"
	}
	rec.Extra = x
	c.cfg.Audit.Append(rec)
}
