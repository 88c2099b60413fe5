package pathform

import "testing"

func TestScopeCookie(t *testing.T) {
	const pre = "/sandboxes/b/proxy/8080"
	cases := []struct{ in, want string }{
		{"a=1; Path=/", "a=1; Path=" + pre + "/"},
		{"a=1; path=/api; HttpOnly", "a=1; HttpOnly; Path=" + pre + "/api"},
		{"a=1", "a=1; Path=" + pre + "/"},
		{"a=1; Path=rel", "a=1; Path=" + pre + "/"},
		{"a=1; Path=" + pre, "a=1; Path=" + pre},
		{"a=1; Path=" + pre + "/x", "a=1; Path=" + pre + "/x"},
		{"a=1; Path=" + pre + "0", "a=1; Path=" + pre + pre + "0"}, // port 80800 is not inside
		{"a=1; Domain=airlock.localhost; Secure; Path=/x; Path=/", "a=1; Secure; Path=" + pre + "/"},
		{"a=1; DOMAIN=.example.com", "a=1; Path=" + pre + "/"},
	}
	for _, c := range cases {
		if got := scopeCookie(c.in, pre); got != c.want {
			t.Errorf("scopeCookie(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestIsDocument(t *testing.T) {
	for ct, want := range map[string]bool{
		"": true, "text/html": true, "text/html; charset=utf-8": true, "TEXT/HTML": true,
		"application/xhtml+xml": true, "image/svg+xml": true, "application/xml": true, "text/xml": true,
		"application/rss+xml": true, "garbage;;": true,
		"application/json": false, "text/plain": false, "image/png": false, "text/javascript": false,
	} {
		if got := isDocument(ct); got != want {
			t.Errorf("isDocument(%q) = %v, want %v", ct, got, want)
		}
	}
}
