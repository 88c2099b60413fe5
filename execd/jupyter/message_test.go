package jupyter

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestSignedRoundTrip(t *testing.T) {
	s := Codec{Key: []byte("k3y")}
	frames, h, err := s.Encode(nil, "sess", "execd", "execute_request", nil, map[string]any{"code": "1+1"})
	if err != nil {
		t.Fatal(err)
	}
	// A ROUTER on the kernel side prepends identities; decoding skips them.
	m, err := s.Decode(append([][]byte{[]byte("ident")}, frames...))
	if err != nil {
		t.Fatal(err)
	}
	var c struct{ Code string }
	json.Unmarshal(m.Content, &c)
	if m.Header != h || m.Header.MsgType != "execute_request" || m.Header.Version != ProtocolVersion || c.Code != "1+1" {
		t.Fatalf("decoded %+v content %s", m.Header, m.Content)
	}
	frames[5] = []byte(`{"code":"evil"}`)
	if _, err := s.Decode(frames); !errors.Is(err, ErrSignature) {
		t.Fatalf("tampered content: %v", err)
	}
	if _, err := (Codec{Key: []byte("other")}).Decode(frames[:5]); err == nil {
		t.Fatal("short message accepted")
	}
}

func TestFindSpecs(t *testing.T) {
	specs := FindSpecs([]string{"testdata/kernels", "testdata/missing"})
	if len(specs) != 1 || specs[0].Name != "fake" || specs[0].Language != "python" || specs[0].Argv[0] != "python3" {
		t.Fatalf("specs %+v", specs)
	}
}
