package lifecycle

import (
	"strings"
	"testing"
)

// TestPoolSpecReadiness: readyPort needs an entrypoint and a port, readyPath needs
// readyPort and a path; a pool with an entrypoint serves only creates with that
// entrypoint and no env.
func TestPoolSpecReadiness(t *testing.T) {
	ep := []string{"/opt/airlock/browser.sh"}
	for _, c := range []struct {
		spec PoolSpec
		err  string
	}{
		{PoolSpec{Image: "i", Size: 1, ReadyPort: 9222}, "needs an entrypoint"},
		{PoolSpec{Image: "i", Size: 1, Entrypoint: ep, ReadyPort: 70000}, "needs an entrypoint and a port"},
		{PoolSpec{Image: "i", Size: 1, Entrypoint: ep, ReadyPath: "/json/version"}, "needs readyPort"},
		{PoolSpec{Image: "i", Size: 1, Entrypoint: ep, ReadyPort: 9222, ReadyPath: "json"}, "must start with /"},
		{PoolSpec{Image: "i", Size: 1, Entrypoint: ep, ReadyPort: 9222, ReadyPath: "/json/version"}, ""},
	} {
		_, err := newPools([]PoolSpec{c.spec}, Limits{}, nil)
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%+v: %v, want %q", c.spec, err, c.err)
		}
	}
	pools, err := newPools([]PoolSpec{{Image: "i", Size: 1, Entrypoint: ep}}, Limits{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{pools: pools}
	for _, c := range []struct {
		entrypoint []string
		env        map[string]string
		served     bool
	}{
		{ep, nil, true},
		{[]string{"sh"}, nil, false},
		{ep, map[string]string{"A": "1"}, false},
	} {
		v := &validated{spec: Spec{Image: "i", Pids: pools[0].pids, Entrypoint: c.entrypoint, Env: c.env}}
		if got := s.poolFor(v) != nil; got != c.served {
			t.Errorf("entrypoint %v env %v: served by the pool %v, want %v", c.entrypoint, c.env, got, c.served)
		}
	}
}
