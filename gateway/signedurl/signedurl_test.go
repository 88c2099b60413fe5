package signedurl

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

func testKeyring(t *testing.T, active string, ids ...string) *Keyring {
	t.Helper()
	var keys []Key
	for _, id := range ids {
		keys = append(keys, Key{ID: id, Secret: []byte("secret-of-key-" + id + "-0123456789")})
	}
	kr, err := NewKeyring(active, keys...)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func TestMintVerify(t *testing.T) {
	kr := testKeyring(t, "a", "a")
	now := time.Unix(1_900_000_000, 0)
	r, err := kr.Mint("sbx-1", 8080, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if r.ExpiresB36 != strconv.FormatUint(uint64(now.Add(time.Hour).Unix()), 36) {
		t.Fatalf("expires_b36 = %q", r.ExpiresB36)
	}
	if len(r.Tag) != TagLen || r.Tag[MACLen] != 'a' || !ValidTag(r.Tag) {
		t.Fatalf("tag %q: want %d chars ending in key id a", r.Tag, TagLen)
	}
	label, err := r.Label()
	if err != nil {
		t.Fatal(err)
	}
	if want := "8080-sbx-1-" + r.ExpiresB36 + "-" + r.Tag; label != want {
		t.Fatalf("label %q, want %q", label, want)
	}
	if p := r.Path(); p != "/sbx-1/8080/"+r.ExpiresB36+"/"+r.Tag {
		t.Fatalf("path %q", p)
	}
	if err := kr.Verify("sbx-1", 8080, r.ExpiresB36, r.Tag, now); err != nil {
		t.Fatalf("verify fresh route: %v", err)
	}
	// The expiry second itself is still valid; one second later is not.
	if err := kr.Verify("sbx-1", 8080, r.ExpiresB36, r.Tag, r.Expires); err != nil {
		t.Fatalf("verify at expiry: %v", err)
	}
	if err := kr.Verify("sbx-1", 8080, r.ExpiresB36, r.Tag, r.Expires.Add(time.Second)); !errors.Is(err, ErrExpired) {
		t.Fatalf("verify after expiry: %v, want ErrExpired", err)
	}
}

func TestVerifyTamper(t *testing.T) {
	kr := testKeyring(t, "a", "a")
	now := time.Unix(1_900_000_000, 0)
	r, err := kr.Mint("sbx-1", 8080, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	later := strconv.FormatUint(uint64(now.Add(48*time.Hour).Unix()), 36)
	flip := func(s string, i int) string {
		b := []byte(s)
		if b[i] == '0' {
			b[i] = '1'
		} else {
			b[i] = '0'
		}
		return string(b)
	}
	cases := []struct {
		name    string
		id      string
		port    int
		exp     string
		tag     string
		wantErr error
	}{
		{"id", "sbx-2", 8080, r.ExpiresB36, r.Tag, ErrBadSignature},
		{"id_case", "SBX-1", 8080, r.ExpiresB36, r.Tag, ErrBadSignature},
		{"port", "sbx-1", 8081, r.ExpiresB36, r.Tag, ErrBadSignature},
		{"expiry_extended", "sbx-1", 8080, later, r.Tag, ErrBadSignature},
		{"expiry_leading_zero", "sbx-1", 8080, "0" + r.ExpiresB36, r.Tag, ErrMalformed},
		{"expiry_uppercase", "sbx-1", 8080, strings.ToUpper(r.ExpiresB36), r.Tag, ErrMalformed},
		{"expiry_empty", "sbx-1", 8080, "", r.Tag, ErrMalformed},
		{"expiry_overflow", "sbx-1", 8080, "zzzzzzzzzzzzz", r.Tag, ErrMalformed},
		{"tag_first_char", "sbx-1", 8080, r.ExpiresB36, flip(r.Tag, 0), ErrBadSignature},
		{"tag_last_mac_char", "sbx-1", 8080, r.ExpiresB36, flip(r.Tag, MACLen-1), ErrBadSignature},
		{"tag_key_id_unknown", "sbx-1", 8080, r.ExpiresB36, r.Tag[:MACLen] + "b", ErrUnknownKey},
		{"tag_short", "sbx-1", 8080, r.ExpiresB36, r.Tag[:MACLen], ErrMalformed},
		{"tag_bad_alphabet", "sbx-1", 8080, r.ExpiresB36, "w" + r.Tag[1:], ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := kr.Verify(c.id, c.port, c.exp, c.tag, now)
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("Verify = %v, want %v", err, c.wantErr)
			}
		})
	}
	// Every single-character change of the MAC is caught.
	for i := 0; i < MACLen; i++ {
		if err := kr.Verify("sbx-1", 8080, r.ExpiresB36, flip(r.Tag, i), now); err == nil {
			t.Fatalf("tag with char %d changed verified", i)
		}
	}
}

func TestRotation(t *testing.T) {
	now := time.Unix(1_900_000_000, 0)
	old := testKeyring(t, "a", "a")
	ra, err := old.Mint("sbx", 80, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	// Step 1: add key b, keep minting with a. Step 2: mint with b, both verify.
	both := testKeyring(t, "b", "a", "b")
	rb, err := both.Mint("sbx", 80, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if rb.Tag[MACLen] != 'b' {
		t.Fatalf("minted with key %c, want b", rb.Tag[MACLen])
	}
	for _, r := range []Route{ra, rb} {
		if err := both.Verify("sbx", 80, r.ExpiresB36, r.Tag, now); err != nil {
			t.Fatalf("keyring a+b rejects route of key %c: %v", r.Tag[MACLen], err)
		}
	}
	// Step 3: drop a; its routes fail as unknown key, b's still verify.
	onlyB := testKeyring(t, "b", "b")
	if err := onlyB.Verify("sbx", 80, ra.ExpiresB36, ra.Tag, now); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("dropped key: %v, want ErrUnknownKey", err)
	}
	if err := onlyB.Verify("sbx", 80, rb.ExpiresB36, rb.Tag, now); err != nil {
		t.Fatal(err)
	}
	// A different secret under the same id does not verify.
	other, _ := NewKeyring("b", Key{ID: "b", Secret: []byte("a completely different secret")})
	if err := other.Verify("sbx", 80, rb.ExpiresB36, rb.Tag, now); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("other secret: %v, want ErrBadSignature", err)
	}
}

func TestKeys(t *testing.T) {
	good := []string{
		"a=base64:MDEyMzQ1Njc4OWFiY2RlZg==",
		"z=hex:000102030405060708090a0b0c0d0e0f",
		"0=raw:sixteen-bytes-ok",
		"k=base64:MDEyMzQ1Njc4OWFiY2RlZg",
	}
	for _, s := range good {
		if _, err := ParseKey(s); err != nil {
			t.Errorf("ParseKey(%q) = %v", s, err)
		}
	}
	bad := []string{"", "a", "A=raw:sixteen-bytes-ok", "ab=raw:sixteen-bytes-ok", "a=raw:short",
		"a=plain:sixteen-bytes-ok", "a=hex:zz", "-=raw:sixteen-bytes-ok"}
	for _, s := range bad {
		if _, err := ParseKey(s); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("ParseKey(%q) = %v, want ErrInvalidKey", s, err)
		}
	}
	k := Key{ID: "a", Secret: []byte("0123456789abcdef")}
	if _, err := NewKeyring("b", k); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("active key missing: %v", err)
	}
	if _, err := NewKeyring("a", k, k); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("duplicate id: %v", err)
	}
	if _, err := NewKeyring("a"); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("no keys: %v", err)
	}
}

func TestMintInvalid(t *testing.T) {
	kr := testKeyring(t, "a", "a")
	exp := time.Unix(1_900_000_000, 0)
	for _, c := range []struct {
		id   string
		port int
		exp  time.Time
	}{
		{"", 80, exp}, {"a/b", 80, exp}, {"sbx", 0, exp}, {"sbx", 65536, exp}, {"sbx", 80, time.Unix(0, 0)},
		{strings.Repeat("x", 129), 80, exp},
	} {
		if _, err := kr.Mint(c.id, c.port, c.exp); !errors.Is(err, ErrInvalidRoute) {
			t.Errorf("Mint(%q,%d,%v) = %v, want ErrInvalidRoute", c.id, c.port, c.exp, err)
		}
	}
	// A UUID with dashes (36 chars) plus a 5-digit port is 64 octets: one too many.
	r, err := kr.Mint("0b7f3c5e-9a41-4d2b-8c6e-1f2a3b4c5d6e", 44772, exp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Label(); !errors.Is(err, ErrTooLong) {
		t.Fatalf("long label: %v, want ErrTooLong", err)
	}
	r, _ = kr.Mint("Upper.Case", 80, exp)
	if _, err := r.Label(); !errors.Is(err, ErrInvalidRoute) {
		t.Fatalf("id not host safe: %v, want ErrInvalidRoute", err)
	}
}

func TestEndpoints(t *testing.T) {
	kr := testKeyring(t, "a", "a")
	exp := time.Unix(1_900_000_000, 0)
	host := Endpoints{Gateway: "127.0.0.1:8081", BaseDomain: "airlock.localhost", Keys: kr}
	path := Endpoints{Gateway: "gw.example:8081", Keys: kr}
	if got := host.Endpoint("sbx-1", 44772); got != "44772-sbx-1.airlock.localhost:8081" {
		t.Errorf("host endpoint %q", got)
	}
	if got := (Endpoints{Gateway: "gw:443", BaseDomain: "s.example.com"}).Endpoint("x", 80); got != "80-x.s.example.com" {
		t.Errorf("host endpoint on 443 %q", got)
	}
	if got := path.Endpoint("sbx-1", 44772); got != "gw.example:8081/sandboxes/sbx-1/proxy/44772" {
		t.Errorf("path endpoint %q", got)
	}
	if got := host.ServerProxy("sbx-1", 8080); got != "127.0.0.1:8081/sandboxes/sbx-1/proxy/8080" {
		t.Errorf("server proxy %q", got)
	}
	r, _ := kr.Mint("sbx-1", 8080, exp)
	// Signed endpoints are always in the path form: a signed host label would be a
	// credential in the TLS server name (and in Certificate Transparency logs).
	for _, ep := range []Endpoints{host, path} {
		if got, _ := ep.Signed("sbx-1", 8080, exp, 0); got != ep.Gateway+r.Path() {
			t.Errorf("signed endpoint %q, want %q", got, ep.Gateway+r.Path())
		}
	}
	r7, _ := kr.MintEpoch("sbx-1", 8080, exp, 7)
	if got, _ := host.Signed("sbx-1", 8080, exp, 7); got != host.Gateway+r7.Path() || r7.Tag == r.Tag {
		t.Errorf("signed endpoint under epoch 7 %q (tag %s, epoch 0 tag %s)", got, r7.Tag, r.Tag)
	}
	long := "0b7f3c5e-9a41-4d2b-8c6e-1f2a3b4c5d6e"
	got, err := host.Signed(long, 44772, exp, 0)
	if err != nil || !strings.HasPrefix(got, "127.0.0.1:8081/"+long+"/44772/") {
		t.Errorf("signed endpoint %q %v, want path form", got, err)
	}
	if _, err := (Endpoints{Gateway: "x:1"}).Signed("a", 1, exp, 0); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("no keys: %v", err)
	}
	// For picks the form lifecycle's endpoint request asks for.
	for _, c := range []struct {
		proxy bool
		exp   *time.Time
		want  string
	}{
		{false, nil, host.Endpoint("sbx-1", 8080)},
		{true, nil, host.ServerProxy("sbx-1", 8080)},
		{true, &exp, "127.0.0.1:8081" + r.Path()},
	} {
		if got, err := host.For("sbx-1", 8080, c.proxy, c.exp, 0); err != nil || got != c.want {
			t.Errorf("For(proxy %v, expires %v) = %q %v, want %q", c.proxy, c.exp, got, err, c.want)
		}
	}
	if _, err := (Endpoints{Gateway: "x:1"}).For("a", 1, false, &exp, 0); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("For signed without keys: %v", err)
	}
}

// TestEpoch: a route verifies only under the epoch it was minted with; epoch 0 is the
// route minted without one (the canonical string of before epochs existed), so routes
// minted before stay valid until the first revocation.
func TestEpoch(t *testing.T) {
	kr := testKeyring(t, "a", "a")
	now := time.Unix(1_800_000_000, 0)
	exp := now.Add(time.Hour)
	r0, _ := kr.Mint("sbx-1", 8080, exp)
	if e0, _ := kr.MintEpoch("sbx-1", 8080, exp, 0); e0.Tag != r0.Tag {
		t.Fatalf("epoch 0 tag %s differs from Mint's %s", e0.Tag, r0.Tag)
	}
	r1, _ := kr.MintEpoch("sbx-1", 8080, exp, 1)
	for _, c := range []struct {
		tag          string
		epoch        uint64
		wantVerified bool
	}{
		{r0.Tag, 0, true},
		{r0.Tag, 1, false},
		{r1.Tag, 1, true},
		{r1.Tag, 0, false},
		{r1.Tag, 2, false},
	} {
		err := kr.VerifyEpoch("sbx-1", 8080, r0.ExpiresB36, c.tag, c.epoch, now)
		if (err == nil) != c.wantVerified || (err != nil && !errors.Is(err, ErrBadSignature)) {
			t.Errorf("tag %s under epoch %d: %v, want verified=%v", c.tag, c.epoch, err, c.wantVerified)
		}
	}
	if err := kr.Verify("sbx-1", 8080, r0.ExpiresB36, r1.Tag, now); !errors.Is(err, ErrBadSignature) {
		t.Errorf("Verify (epoch 0) accepted an epoch 1 route: %v", err)
	}
}

// TestEndpointsPathPorts: ports in PathPorts keep the path form while the other ports of
// the same Endpoints use the host form; signed endpoints are in path form for every port.
func TestEndpointsPathPorts(t *testing.T) {
	kr := testKeyring(t, "a", "a")
	exp := time.Unix(1_900_000_000, 0)
	e := Endpoints{Gateway: "127.0.0.1:8081", BaseDomain: "airlock.localhost", Keys: kr,
		PathPorts: func(p int) bool { return p == 44772 }}
	if got := e.Endpoint("sbx-1", 44772); got != "127.0.0.1:8081/sandboxes/sbx-1/proxy/44772" {
		t.Errorf("path port endpoint %q, want the path form", got)
	}
	if got := e.Endpoint("sbx-1", 8080); got != "8080-sbx-1.airlock.localhost:8081" {
		t.Errorf("user port endpoint %q, want the host form", got)
	}
	for _, port := range []int{44772, 8080} {
		// Signed endpoints are always in path form (a signed host label would be a
		// credential in the TLS server name).
		r, _ := kr.Mint("sbx-1", port, exp)
		if got, err := e.For("sbx-1", port, false, &exp, 0); err != nil || got != "127.0.0.1:8081"+r.Path() {
			t.Errorf("signed endpoint of %d: %q %v, want the signed path form", port, got, err)
		}
	}
}
