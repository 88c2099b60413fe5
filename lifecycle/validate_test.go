package lifecycle

import (
	"errors"
	"testing"
)

func TestParseQuantity(t *testing.T) {
	cases := []struct {
		in   string
		want float64
		ok   bool
	}{
		{"500m", 0.5, true}, {"1", 1, true}, {"0.25", 0.25, true}, {"2Gi", 2 << 30, true},
		{"512Mi", 512 << 20, true}, {"1G", 1e9, true}, {"100k", 1e5, true}, {"1.5Gi", 1.5 * (1 << 30), true},
		{"", 0, false}, {"2GB", 0, false}, {"-1", 0, false}, {"1e3", 0, false}, {"abc", 0, false}, {"1 Gi", 0, false},
	}
	for _, c := range cases {
		q, err := ParseQuantity(c.in)
		if (err == nil) != c.ok {
			t.Errorf("ParseQuantity(%q) error %v, want ok=%v", c.in, err, c.ok)
			continue
		}
		if c.ok {
			if f, _ := q.Float64(); f != c.want {
				t.Errorf("ParseQuantity(%q) = %g, want %g", c.in, f, c.want)
			}
		}
	}
}

func TestMetadataKeys(t *testing.T) {
	good := []string{"a", "team", "app.kubernetes.io/name", "x_y.z-1", "example.com/k"}
	bad := []string{"", "-a", "a-", "opensandbox.io/x", "airlock.dev/x", "/x", "Bad_Prefix/x", "a/b/c", "x y"}
	for _, k := range good {
		if err := validateMetadataKey(k); err != nil {
			t.Errorf("key %q rejected: %v", k, err)
		}
	}
	for _, k := range bad {
		if err := validateMetadataKey(k); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("key %q accepted (%v)", k, err)
		}
	}
}

func TestValidateCreateResources(t *testing.T) {
	l := Limits{MaxCPUs: 2}
	l.setDefaults()
	to := int64(120)
	req := &CreateRequest{
		Image: &ImageSpec{URI: "img"}, Entrypoint: []string{"sh"}, Timeout: &to,
		ResourceLimits: map[string]string{"cpu": "250m", "memory": "512Mi", "pids": "100"},
	}
	v, err := validateCreate(req, l)
	if err != nil {
		t.Fatal(err)
	}
	if v.spec.NanoCPUs != 250_000_000 || v.spec.MemoryBytes != 512<<20 || v.spec.Pids != 100 || v.timeout.Seconds() != 120 {
		t.Errorf("spec %+v timeout %s", v.spec, v.timeout)
	}
	req.ResourceLimits = map[string]string{"cpu": "3"}
	if _, err := validateCreate(req, l); !errors.Is(err, ErrInvalidResources) {
		t.Errorf("cpu above MaxCPUs: %v", err)
	}
}
