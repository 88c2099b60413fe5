package vault

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Wire types of the OpenSandbox egress API's Credential Vault (egress-api.yaml,
// components.schemas: Credential, CredentialBinding, CredentialMatch, CredentialAuth and
// the mutation requests). Values are write-only: they come in, never go out.

// Credential is a named secret (schema Credential).
type Credential struct {
	Name   string `json:"name"`
	Source Source `json:"source"`
}

// Source is an inline credential source (schema InlineCredentialSource).
type Source struct {
	Type  string `json:"type"`
	Value string `json:"value"`
}

// Binding injects a credential into requests that match (schema CredentialBinding).
type Binding struct {
	Name  string `json:"name"`
	Match Match  `json:"match"`
	Auth  Auth   `json:"auth"`
}

// Match selects requests (schema CredentialMatch). Empty lists take the spec's
// defaults: schemes [https], ports [443], methods [GET POST PUT PATCH DELETE], paths
// ["/*"].
type Match struct {
	Schemes []string `json:"schemes,omitempty"`
	Ports   []int    `json:"ports,omitempty"`
	Hosts   []string `json:"hosts"`
	Methods []string `json:"methods,omitempty"`
	Paths   []string `json:"paths,omitempty"`
}

// Auth is how the credential is sent (schema CredentialAuth, discriminated by type:
// bearer, basic, apiKey, customHeaders).
type Auth struct {
	Type       string      `json:"type"`
	Credential string      `json:"credential,omitempty"`
	Name       string      `json:"name,omitempty"`
	Headers    []HeaderRef `json:"headers,omitempty"`
}

// HeaderRef is one custom header and the credential it carries (CustomHeaderEntry).
type HeaderRef struct {
	Name       string `json:"name"`
	Credential string `json:"credential"`
}

// CreateRequest is POST /credential-vault (CredentialVaultCreateRequest).
type CreateRequest struct {
	Credentials []Credential `json:"credentials"`
	Bindings    []Binding    `json:"bindings"`
}

// MutationRequest is PATCH /credential-vault (CredentialVaultMutationRequest).
type MutationRequest struct {
	ExpectedRevision *int64             `json:"expectedRevision,omitempty"`
	Credentials      CredentialMutation `json:"credentials"`
	Bindings         BindingMutation    `json:"bindings"`
}

// CredentialMutation is CredentialMutationSet.
type CredentialMutation struct {
	Add     []Credential `json:"add,omitempty"`
	Replace []Credential `json:"replace,omitempty"`
	Delete  []string     `json:"delete,omitempty"`
}

// BindingMutation is CredentialBindingMutationSet.
type BindingMutation struct {
	Add     []Binding `json:"add,omitempty"`
	Replace []Binding `json:"replace,omitempty"`
	Delete  []string  `json:"delete,omitempty"`
}

// State is the sanitized vault (CredentialVaultState): names, types, revisions.
type State struct {
	Revision    int64             `json:"revision"`
	Credentials []CredentialMeta  `json:"credentials"`
	Bindings    []BindingMetadata `json:"bindings"`
}

// CredentialMeta is CredentialMetadata.
type CredentialMeta struct {
	Name       string `json:"name"`
	SourceType string `json:"sourceType"`
	Revision   int64  `json:"revision"`
}

// BindingMetadata is CredentialBindingMetadata (match with defaults filled in).
type BindingMetadata struct {
	Name     string       `json:"name"`
	Revision int64        `json:"revision"`
	Match    Match        `json:"match"`
	Auth     AuthMetadata `json:"auth"`
}

// AuthMetadata is CredentialAuthMetadata: the type, and the header name of apiKey.
type AuthMetadata struct {
	Type string `json:"type"`
	Name string `json:"name,omitempty"`
}

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)
	tokenRE  = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+\\-.^_`|~]+$") // the spec's header-name pattern
	labelRE  = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	defaults = Match{Schemes: []string{"https"}, Ports: []int{443},
		Methods: []string{"GET", "POST", "PUT", "PATCH", "DELETE"}, Paths: []string{"/*"}}
)

// normalize fills the defaults of m and checks it; hosts and schemes are lower-cased,
// methods upper-cased. Errors name the field, never a value of a credential.
func (m Match) normalize() (Match, error) {
	out := Match{}
	if len(m.Hosts) == 0 {
		return out, fmt.Errorf("match.hosts is required")
	}
	for _, h := range m.Hosts {
		h = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h)), ".")
		if !validHost(h) {
			return out, fmt.Errorf("match.hosts: %q is not a host name or *.suffix wildcard", h)
		}
		out.Hosts = append(out.Hosts, h)
	}
	out.Schemes = orDefault(m.Schemes, defaults.Schemes)
	for i, s := range out.Schemes {
		s = strings.ToLower(s)
		if s != "http" && s != "https" {
			return out, fmt.Errorf("match.schemes: %q is not http or https", s)
		}
		out.Schemes[i] = s
	}
	out.Ports = orDefault(m.Ports, defaults.Ports)
	for _, p := range out.Ports {
		if p < 1 || p > 65535 {
			return out, fmt.Errorf("match.ports: %d is not a port", p)
		}
	}
	out.Methods = orDefault(m.Methods, defaults.Methods)
	for i, meth := range out.Methods {
		meth = strings.ToUpper(meth)
		if !tokenRE.MatchString(meth) {
			return out, fmt.Errorf("match.methods: %q is not an HTTP method", meth)
		}
		out.Methods[i] = meth
	}
	out.Paths = orDefault(m.Paths, defaults.Paths)
	for _, p := range out.Paths {
		if !strings.HasPrefix(p, "/") {
			return out, fmt.Errorf("match.paths: %q does not start with /", p)
		}
	}
	return out, nil
}

func orDefault[T any](v, def []T) []T {
	if len(v) == 0 {
		return slices.Clone(def)
	}
	return slices.Clone(v)
}

// validHost accepts a lower-case FQDN or "*." followed by one.
func validHost(h string) bool {
	h = strings.TrimPrefix(h, "*.")
	if h == "" || len(h) > 253 {
		return false
	}
	for _, l := range strings.Split(h, ".") {
		if !labelRE.MatchString(l) {
			return false
		}
	}
	return true
}

// hostMatches reports whether host matches pattern: equal, or for "*.x" a subdomain of
// x (not x itself), as policy wildcards.
func hostMatches(pattern, host string) bool {
	if suffix, ok := strings.CutPrefix(pattern, "*."); ok {
		return strings.HasSuffix(host, "."+suffix)
	}
	return pattern == host
}

// pathMatches: "/*" matches everything, a trailing "*" a prefix, otherwise the exact
// path.
func pathMatches(pattern, path string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(path, prefix)
	}
	return pattern == path
}

// credentialsOf lists the credential names an auth refers to, checking its shape.
func (a Auth) credentialsOf() ([]string, error) {
	switch a.Type {
	case "bearer", "basic":
		if a.Credential == "" {
			return nil, fmt.Errorf("auth %s needs credential", a.Type)
		}
		return []string{a.Credential}, nil
	case "apiKey":
		if a.Credential == "" || !tokenRE.MatchString(a.Name) {
			return nil, fmt.Errorf("auth apiKey needs credential and a header name (name)")
		}
		return []string{a.Credential}, nil
	case "customHeaders":
		if len(a.Headers) == 0 {
			return nil, fmt.Errorf("auth customHeaders needs at least one header")
		}
		var out []string
		for _, h := range a.Headers {
			if !tokenRE.MatchString(h.Name) || h.Credential == "" {
				return nil, fmt.Errorf("auth customHeaders: each header needs a valid name and a credential")
			}
			out = append(out, h.Credential)
		}
		return out, nil
	default:
		return nil, fmt.Errorf("auth.type %q: want bearer, basic, apiKey or customHeaders", a.Type)
	}
}
