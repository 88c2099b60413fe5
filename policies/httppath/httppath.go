// Package httppath decides whether an HTTP request path can be matched by prefix and
// forwarded as it is: one definition of a canonical path, shared by the Credential
// Vault's bindings and the policy's HTTP rules, so that a rule for "/repos/*" cannot be
// reached by "/repos/../user/keys" or "/repos/%2e%2e/user/keys".
//
// Servers disagree on how they resolve dot segments (RFC 3986 §5.2.4,
// remove_dot_segments), empty segments, backslashes and percent-encoded delimiters; a
// path holding none of them means the same resource to every server, so matching its
// decoded form by prefix is sound. Canonical refuses every other path rather than
// guess how the upstream would resolve it.
package httppath

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// ErrNotCanonical wraps every refusal of Canonical.
var ErrNotCanonical = errors.New("path is not canonical")

// Canonical checks escapedPath, a request target's path as it travels on the wire
// (url.URL.EscapedPath, no query), and returns its percent-decoded form for matching.
// It refuses, with an error wrapping ErrNotCanonical that names the reason, a path that
//   - does not start with "/";
//   - holds a dot segment ("." or ".."), decoded or percent-encoded;
//   - holds an empty segment ("//");
//   - holds a backslash, or a percent-encoded '.', '/' or '\\' (%2e, %2f, %5c, either
//     case), or an encoded '%' followed by one of those (double encoding);
//   - holds a NUL or an invalid percent-encoding.
//
// It performs no I/O and allocates only for the decoded copy.
func Canonical(escapedPath string) (string, error) {
	if !strings.HasPrefix(escapedPath, "/") {
		return "", fmt.Errorf("%w: it does not start with /", ErrNotCanonical)
	}
	if strings.ContainsRune(escapedPath, '\\') {
		return "", fmt.Errorf("%w: it holds a backslash", ErrNotCanonical)
	}
	if encodedDelimiter(escapedPath) {
		return "", fmt.Errorf("%w: it holds a percent-encoded '.', '/' or '\\'", ErrNotCanonical)
	}
	decoded, err := url.PathUnescape(escapedPath)
	if err != nil {
		return "", fmt.Errorf("%w: invalid percent-encoding", ErrNotCanonical)
	}
	if strings.ContainsRune(decoded, 0) || strings.ContainsRune(decoded, '\\') {
		return "", fmt.Errorf("%w: it holds a NUL or a backslash", ErrNotCanonical)
	}
	if encodedDelimiter(decoded) {
		return "", fmt.Errorf("%w: it holds a double percent-encoded delimiter", ErrNotCanonical)
	}
	for seg := range strings.SplitSeq(decoded[1:], "/") {
		switch seg {
		case ".", "..":
			return "", fmt.Errorf("%w: it holds a dot segment", ErrNotCanonical)
		}
	}
	if strings.Contains(decoded, "//") {
		return "", fmt.Errorf("%w: it holds an empty segment (//)", ErrNotCanonical)
	}
	return decoded, nil
}

// encodedDelimiter reports whether s holds %2e, %2f or %5c in either case.
func encodedDelimiter(s string) bool {
	for i := 0; i+2 < len(s); i++ {
		if s[i] != '%' {
			continue
		}
		switch hi, lo := s[i+1], s[i+2]|0x20; {
		case hi == '2' && (lo == 'e' || lo == 'f'), hi == '5' && lo == 'c':
			return true
		}
	}
	return false
}
