package console

import "testing"

func TestDesktopURL(t *testing.T) {
	const q = "/vnc.html?autoconnect=true&resize=scale&reconnect=true&show_dot=true"
	for _, c := range []struct {
		name, scheme, endpoint, want string
	}{
		{"loopback_gateway", "http", "127.0.0.1:8081/abc123/6080/t5xk2g/0123456789abca",
			"http://6080-abc123-t5xk2g-0123456789abca.airlock.localhost:8081" + q},
		{"default_port", "https", "gw.example.com:443/abc123/6080/t5xk2g/0123456789abca",
			"https://6080-abc123-t5xk2g-0123456789abca.airlock.localhost" + q},
		{"no_port", "https", "gw.example.com/abc123/6080/t5xk2g/0123456789abca",
			"https://6080-abc123-t5xk2g-0123456789abca.airlock.localhost" + q},
		{"unsigned", "http", "127.0.0.1:8081/sandboxes/abc123/proxy/6080", ""},
		{"upper_case_id", "http", "127.0.0.1:8081/ABC/6080/t5xk2g/0123456789abca", ""},
		{"bad_expiry", "http", "127.0.0.1:8081/abc123/6080/!!/0123456789abca", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := desktopURL(c.scheme, "airlock.localhost", c.endpoint)
			if got != c.want || (err == nil) != (c.want != "") {
				t.Errorf("desktopURL(%q) = %q, %v; want %q", c.endpoint, got, err, c.want)
			}
		})
	}
}
