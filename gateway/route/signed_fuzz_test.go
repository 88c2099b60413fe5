package route

import (
	"strconv"
	"testing"
	"time"

	"github.com/airlockdev/airlock/gateway/signedurl"
)

// FuzzSignedRoute mints a signed route for an arbitrary id, port and expiry, writes it in
// each form a client may use (host label, OpenSandbox-Ingress-To, /<id>/<port>/<exp>/<tag>
// path), parses the request back and checks the invariant the gateway relies on: the
// signed candidate names the minted id and port, re-verifies with the minting key, and
// verifies neither with another secret under the same key id nor for another port or id.
func FuzzSignedRoute(f *testing.F) {
	right := fuzzKeyring(f, "signed-route-fuzz-secret-0001")
	other := fuzzKeyring(f, "signed-route-fuzz-secret-0002")
	f.Add("abc", 44772, int64(4102444800), uint8(0))
	f.Add("my-box-2", 18080, int64(1700000000), uint8(1))
	f.Add("a-8080", 8080, int64(1), uint8(2))
	f.Add("Box.With_Dots", 80, int64(99999999999), uint8(2))
	f.Fuzz(func(t *testing.T, id string, port int, sec int64, form uint8) {
		r, err := right.Mint(id, port, time.Unix(sec, 0))
		if err != nil || sec >= 1<<62 {
			return
		}
		var in Input
		switch form % 3 {
		case 0:
			label, err := r.Label()
			if err != nil {
				return // not host-safe or longer than a DNS label: the path form serves it
			}
			in.Host = label + ".airlock.localhost:8081"
		case 1:
			label, err := r.Label()
			if err != nil {
				return
			}
			in.IngressTo = label
		default:
			in.Path = r.Path() + "/x"
		}
		cands, err := Parse(in, domains, nil)
		if err != nil {
			t.Fatalf("%+v: %v", in, err)
		}
		var c *Candidate
		for i := range cands {
			if cands[i].Signed && cands[i].ID == id && cands[i].Port == port {
				c = &cands[i]
				break
			}
		}
		if c == nil {
			t.Fatalf("%+v: no signed candidate for (%q, %d) in %+v", in, id, port, cands)
		}
		now := r.Expires.Add(-time.Second)
		if err := right.Verify(c.ID, c.Port, c.ExpiresB36, c.Tag, now); err != nil {
			t.Fatalf("parsed route does not re-verify with the minting key: %v", err)
		}
		if err := other.Verify(c.ID, c.Port, c.ExpiresB36, c.Tag, now); err == nil {
			t.Fatal("parsed route verifies with another secret")
		}
		if err := right.Verify(c.ID, c.Port%65535+1, c.ExpiresB36, c.Tag, now); err == nil {
			t.Fatal("parsed route verifies for another port")
		}
		if err := right.Verify(c.ID+"0", c.Port, c.ExpiresB36, c.Tag, now); err == nil {
			t.Fatal("parsed route verifies for another id")
		}
		if c.Form == FormPath && c.Rest(in.Path) != "/x" {
			t.Fatalf("rest %q after the signed prefix %q", c.Rest(in.Path), c.Prefix)
		}
	})
}

// FuzzParsedSignedCandidates: whatever a request holds, a signed candidate Parse returns
// has a syntactically valid expiry and tag, and verifies with no keyring that lacks its
// key id (Verify of a nil keyring is ErrUnknownKey, never a panic).
func FuzzParsedSignedCandidates(f *testing.F) {
	f.Add("8080-abc-x2qxvk-"+tag+".airlock.localhost", "/", "")
	f.Add("", "/abc/8080/x2qxvk/"+tag+"/v1", "")
	f.Add("", "/", "abc-44772-0-"+tag)
	f.Add("", "/abc/8080/"+strconv.Itoa(7)+"/"+tag, "")
	f.Fuzz(func(t *testing.T, host, path, ingress string) {
		cands, err := Parse(Input{Host: host, Path: path, IngressTo: ingress}, domains, nil)
		if err != nil {
			return
		}
		var none *signedurl.Keyring
		for _, c := range cands {
			if !c.Signed {
				continue
			}
			if !signedurl.ValidExpiry(c.ExpiresB36) || !signedurl.ValidTag(c.Tag) {
				t.Fatalf("signed candidate with malformed parts: %+v", c)
			}
			if err := none.Verify(c.ID, c.Port, c.ExpiresB36, c.Tag, time.Unix(0, 0)); err == nil {
				t.Fatalf("signed candidate %+v verifies without keys", c)
			}
		}
	})
}

func fuzzKeyring(f *testing.F, secret string) *signedurl.Keyring {
	kr, err := signedurl.NewKeyring("a", signedurl.Key{ID: "a", Secret: []byte(secret)})
	if err != nil {
		f.Fatal(err)
	}
	return kr
}
