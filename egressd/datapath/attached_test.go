package datapath

import (
	"errors"
	"slices"
	"testing"
)

// rec is a backend's record of a sandbox in these tests: hooked on ifname.
type rec struct{ ifname string }

func TestAttachedSetClaim(t *testing.T) {
	var a AttachedSet[*rec]
	var torn []string
	teardown := func(r *rec) error { torn = append(torn, r.ifname); return nil }
	claim := func(id, ifname string) (*rec, bool, error) {
		a.Lock()
		defer a.Unlock()
		return a.Claim(Spec{ID: id, HostIfname: ifname, HostIfindex: 7}, func(r *rec) bool { return r.ifname == ifname }, teardown)
	}

	if r, ok, err := claim("a", "veth-a"); r != nil || ok || err != nil {
		t.Fatalf("new sandbox: %v %v %v", r, ok, err)
	}
	a.Add("a", &rec{ifname: "veth-a"})
	if r, ok, err := claim("a", "veth-a"); err != nil || !ok || r.ifname != "veth-a" {
		t.Fatalf("same interface: %v %v %v, want the record to update in place", r, ok, err)
	}
	if _, _, err := claim("b", "veth-a"); !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("another sandbox's interface: %v, want ErrInvalidSpec", err)
	}
	// Recreated on a new interface: the old record is torn down and leaves the set.
	if r, ok, err := claim("a", "veth-a2"); r != nil || ok || err != nil {
		t.Fatalf("new interface: %v %v %v", r, ok, err)
	}
	if !slices.Equal(torn, []string{"veth-a"}) || a.Len() != 0 {
		t.Fatalf("torn down %v, %d left; want [veth-a], 0", torn, a.Len())
	}
	a.Lock()
	if !a.Close() || a.Close() {
		t.Fatal("Close reports open only the first time")
	}
	a.Unlock()
	if _, _, err := claim("c", "veth-c"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("claim after Close: %v, want ErrUnavailable", err)
	}
}

func TestAttachedSetDetach(t *testing.T) {
	var a AttachedSet[*rec]
	a.Add("b", &rec{ifname: "veth-b"})
	a.Add("a", &rec{ifname: "veth-a"})
	if got := a.Attached(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("Attached = %v, want sorted [a b]", got)
	}
	if err := a.Detach("x", func(*rec) error { t.Fatal("teardown of an unknown id"); return nil }); !errors.Is(err, ErrUnknownSandbox) {
		t.Fatalf("Detach unknown: %v, want ErrUnknownSandbox", err)
	}
	// A failed teardown keeps the sandbox (a retry can finish), unless it removed it.
	boom := errors.New("boom")
	if err := a.Detach("a", func(*rec) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Detach: %v, want the teardown's error", err)
	}
	if _, ok := a.Lookup("a"); !ok {
		t.Fatal("a failed teardown dropped the sandbox")
	}
	if err := a.Detach("a", func(*rec) error { a.Remove("a"); return boom }); !errors.Is(err, boom) {
		t.Fatalf("Detach: %v", err)
	}
	if _, err := a.Get("a"); !errors.Is(err, ErrUnknownSandbox) {
		t.Fatalf("removed by its teardown: Get = %v, want ErrUnknownSandbox", err)
	}
	if err := a.Detach("b", func(*rec) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got := a.Attached(); len(got) != 0 {
		t.Fatalf("Attached after detaching all = %v", got)
	}
}
