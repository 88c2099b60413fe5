package gateway

import "github.com/airlockdev/airlock/opensandbox"

// RedactedLogHeaders are the request headers whose values never appear in Caddy's logs.
// Caddy itself redacts Authorization, Proxy-Authorization, Cookie and Set-Cookie
// (caddyhttp.LoggableHTTPHeader, unless a server sets log_credentials); these are
// Airlock's and OpenSandbox's credentials on top: lifecycle's API key, a sandbox's access
// token under both names (OSEP-0011) and execd's token. Names are in canonical MIME form,
// as Caddy's log records carry them.
var RedactedLogHeaders = []string{
	opensandbox.HeaderAPIKey,       // Open-Sandbox-Api-Key
	opensandbox.HeaderAccessToken,  // X-Airlock-Access-Token
	opensandbox.HeaderSecureAccess, // Opensandbox-Secure-Access
	"X-Execd-Access-Token",         // execd.TokenHeader, canonical form
}

// redactedLogValue replaces a redacted header's value, as Caddy writes its own.
const redactedLogValue = "REDACTED"

// logEncoder returns the Caddy log encoder of the embedded gateway: JSON lines through
// Caddy's "filter" encoder, which replaces every RedactedLogHeaders value under
// request>headers (the field the server's error and access logs and reverse_proxy's
// "upstream roundtrip" debug log put the request in) with "REDACTED", under the
// "airlock_lazy" encoder (LazyEncoder), which encodes a logger's With fields only
// when an entry is written.
func logEncoder() map[string]any {
	return map[string]any{"format": "airlock_lazy", "wrap": redactingEncoder()}
}

// redactingEncoder is the "filter" encoder of logEncoder, on its own: the fields of
// every entry, given with With or with the entry, are redacted by it.
func redactingEncoder() map[string]any {
	fields := make(map[string]any, len(RedactedLogHeaders))
	for _, h := range RedactedLogHeaders {
		fields["request>headers>"+h] = map[string]any{"filter": "replace", "value": redactedLogValue}
	}
	return map[string]any{"format": "filter", "wrap": map[string]any{"format": "json"}, "fields": fields}
}
