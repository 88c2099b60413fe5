package dnsfilter

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestLabelScore(t *testing.T) {
	for _, c := range []struct {
		label    string
		min, max float64
	}{
		// words and names: nothing counted
		{"files", 0, 0},
		{"pythonhosted", 0, 0},
		{"production", 0, 0},
		{"Registry-1", 0, 0},
		{"my-long-service-name-for-the-production-environment-eu-west", 0, 0},
		{"thisisaverylongsubdomainnamewithmanywordsinit", 0, 0},
		{"", 0, 0},
		// names with a number or an id: low
		{"prod-registry-k8s-io-us-east-1", 1, 20},
		{"d3c33hcgiwev3", 30, 45},
		{"123456789012", 30, 45},
		{"vpce-0a1b2c3d4e5f67890-abcdefgh", 50, 80},
		{"fluffy-space-goggles-5g4x6vq9x7hp4xv-8080", 50, 80},
		// 128-bit identifiers: under the default limit
		{"e3b0c44298fc1c149afbf4c8996fb924", 90, 130},
		{"3f2504e0-4f89-11d3-9a0c-0305e82c3301", 90, 130},
		{"pub-3626123a908346a7a8be8d9295f44e26", 90, 130},
		{"abcdefghij1234567890klmnopqrstuv", 140, DefaultMaxLabelBits},
		// encoded data: over it
		{"4f6e6365207570706e206120746d6520696e2061206c616e642066617220", 180, 250}, // ASCII text, hex-encoded
		{"4F6E6365207570706E206120746D6520696E2061206C616E642066617220", 180, 250},
		{"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852", 200, 250}, // random data
		{"j5xgg2jaovyg63ramuqhi2lnmuqgs3rameqgyylom4qgmylsebqxo", 200, 300},
		{"T25jZSB1cG9uIGEgdGltZSBpbiBhIGxhbmQgZmFyIGF3YXksIGEgZHJhZ29u", 230, 320},
		{"bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi", 240, 290},
		{"e3b0-c442-98fc-1c14-9afb-f4c8-996f-b924-27ae-41e4-649b-934c", 170, 200}, // split by hyphens
	} {
		got := labelScore(c.label)
		if got < c.min || got > c.max || (c.max < DefaultMaxLabelBits) != (got <= DefaultMaxLabelBits && c.max < DefaultMaxLabelBits) {
			t.Errorf("labelScore(%q) = %.1f, want %.0f..%.0f", c.label, got, c.min, c.max)
		}
	}
	if n := testing.AllocsPerRun(100, func() { labelScore("4f6e6365207570706e206120746d6520696e2061206c616e642066617220") }); n != 0 {
		t.Errorf("labelScore allocates %v times", n)
	}
}

// TestLabelScoreRandom: the default limit lets every random 32-character hex or base36
// label (a 128-bit or 160-bit id) through and stops every random 48-hex-digit label.
func TestLabelScoreRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(alphabet string, n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	const hex, b36 = "0123456789abcdef", "abcdefghijklmnopqrstuvwxyz0123456789"
	for range 2000 {
		for _, l := range []string{random(hex, 32), random(b36, 32), "pub-" + random(hex, 32),
			random(hex, 8) + "-" + random(hex, 4) + "-" + random(hex, 4) + "-" + random(hex, 4) + "-" + random(hex, 12)} {
			if s := labelScore(l); s > DefaultMaxLabelBits {
				t.Fatalf("labelScore(%s) = %.1f: a 32-character id over the limit", l, s)
			}
		}
		if l := random(hex, 48); labelScore(l) <= DefaultMaxLabelBits {
			t.Fatalf("labelScore(%s) = %.1f: 48 hex digits under the limit", l, labelScore(l))
		}
	}
}

func TestGuardConfigDefaults(t *testing.T) {
	g, err := GuardConfig{}.withDefaults()
	if err != nil || g != (GuardConfig{NamesPerSandbox: 300, NamesPerDomain: 100, NamesPerRule: 200, MaxLabelBits: 160}) {
		t.Errorf("defaults = %+v, %v", g, err)
	}
	g, err = GuardConfig{NamesPerSandbox: -1, NamesPerDomain: -1, NamesPerRule: 7, MaxLabelBits: -1}.withDefaults()
	if err != nil || g != (GuardConfig{NamesPerRule: 7}) {
		t.Errorf("off = %+v, %v", g, err)
	}
	if _, err := (GuardConfig{MaxLabelBits: math.NaN()}).withDefaults(); !errors.Is(err, ErrConfig) {
		t.Errorf("NaN: %v", err)
	}
	h := startFilter(t, testPolicy, nil)
	if h.srv.caps != (nameCaps{sandbox: 300, domain: 100, rule: 200}) || h.srv.cfg.Guard.MaxLabelBits != 160 {
		t.Errorf("a server with the zero Config has caps %+v, label limit %v", h.srv.caps, h.srv.cfg.Guard.MaxLabelBits)
	}
}

// TestNameGuardWindow: names are counted per minute; the next minute starts afresh; a
// sandbox idle for two minutes is dropped.
func TestNameGuardWindow(t *testing.T) {
	g := newNameGuard()
	caps := nameCaps{domain: 2}
	t0 := time.Now()
	for i, c := range []struct {
		name string
		at   time.Duration
		ok   bool
	}{
		{"a.example.com", 0, true},
		{"b.example.com", time.Second, true},
		{"a.example.com", 2 * time.Second, true}, // seen
		{"c.example.com", 3 * time.Second, false},
		{"c.example.com", 59 * time.Second, false},
		{"c.example.com", 61 * time.Second, true}, // a new minute
		{"d.example.com", 62 * time.Second, true},
		{"e.example.com", 63 * time.Second, false},
	} {
		if got := g.admit("sb", c.name, "egress[0]", caps, t0.Add(c.at)) == ""; got != c.ok {
			t.Errorf("step %d: admit(%s) = %t", i, c.name, got)
		}
	}
	if got := g.admit("other", "x.example.com", "egress[0]", caps, t0.Add(4*time.Minute)); got != "" {
		t.Errorf("another sandbox: %s", got)
	}
	g.mu.RLock()
	_, kept := g.sandboxes["sb"]
	n := len(g.sandboxes)
	g.mu.RUnlock()
	if kept || n != 1 {
		t.Errorf("after two idle minutes: sb kept %t, %d sandboxes", kept, n)
	}
	if n := testing.AllocsPerRun(100, func() { g.admit("other", "x.example.com", "egress[0]", caps, t0.Add(4*time.Minute)) }); n != 0 {
		t.Errorf("a name seen this minute allocates %v times", n)
	}
}

// TestNameGuardConcurrent: concurrent new names never pass a cap.
func TestNameGuardConcurrent(t *testing.T) {
	g := newNameGuard()
	caps := nameCaps{sandbox: 50, domain: 40, rule: 45}
	now := time.Now()
	var ok atomic.Int32
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if g.admit("sb", "n"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+itoa(i)+".example.com", "egress[0]", caps, now) == "" {
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 40 {
		t.Errorf("%d names admitted under a cap of 40", ok.Load())
	}
}

func itoa(i int) string {
	var b [20]byte
	n := len(b)
	for {
		n--
		b[n] = byte('0' + i%10)
		if i /= 10; i == 0 {
			return string(b[n:])
		}
	}
}
