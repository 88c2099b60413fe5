package httppath

import (
	"errors"
	"testing"
)

func TestCanonical(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		ok             bool
	}{
		{"plain", "/repos/a/b", "/repos/a/b", true},
		{"root", "/", "/", true},
		{"trailing-slash", "/repos/", "/repos/", true},
		{"encoded-space", "/a%20b", "/a b", true},
		{"encoded-letter", "/repos/%41", "/repos/A", true},
		{"dots-inside-name", "/a/..b/c.d/...", "/a/..b/c.d/...", true},
		{"dotdot", "/repos/../user/keys", "", false},
		{"dot", "/repos/./x", "", false},
		{"trailing-dotdot", "/repos/..", "", false},
		{"encoded-dotdot", "/repos/%2e%2e/user/keys", "", false},
		{"encoded-dotdot-upper", "/repos/%2E%2E/user/keys", "", false},
		{"half-encoded-dotdot", "/repos/.%2e/user", "", false},
		{"encoded-slash", "/repos/..%2fuser", "", false},
		{"encoded-backslash", "/repos/..%5cuser", "", false},
		{"backslash", "/repos\\..\\user", "", false},
		{"double-encoded", "/repos/%252e%252e/user", "", false},
		{"empty-segment", "/repos//x", "", false},
		{"no-leading-slash", "repos/x", "", false},
		{"bad-escape", "/repos/%zz", "", false},
		{"nul", "/repos/%00", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Canonical(tc.in)
			if tc.ok != (err == nil) || got != tc.want {
				t.Fatalf("Canonical(%q) = %q, %v; want %q, ok=%v", tc.in, got, err, tc.want, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrNotCanonical) {
				t.Fatalf("error %v does not wrap ErrNotCanonical", err)
			}
		})
	}
}
