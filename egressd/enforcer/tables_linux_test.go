package enforcer

import (
	"errors"
	"slices"
	"testing"

	"github.com/airlockdev/airlock/egressd/datapath"
	dt "github.com/airlockdev/airlock/egressd/datapath/datapathtest"
	"github.com/airlockdev/airlock/egressd/nftfilter"
	"github.com/airlockdev/airlock/internal/testenv"
)

// TestTablesSeparateInstances: two egressd instances in one network namespace, each
// with its own pin root and nftables table, do not see each other's sandboxes. A
// forced-eBPF instance with another table leaves an nftables sandbox alone (it once
// adopted it, and egressd then detached it as not in its lifecycle); one with the same
// table takes it over.
func TestTablesSeparateInstances(t *testing.T) {
	testenv.NeedBPF(t)
	const tableA, tableB = "airlock_ta", "airlock_tb"
	e := &env{mode: ModeNFTables, tp: dt.NewTopology(t), root: pinRoot(t)}
	t.Cleanup(func() {
		nftfilter.RemoveTable(e.tp.Host.Path(), tableA)
		nftfilter.RemoveTable(e.tp.Host.Path(), tableB)
	})
	open := func(mode Mode, table string) datapath.Datapath {
		t.Helper()
		dp, err := New(Config{Mode: mode, NetNS: e.tp.Host.Path(), EBPF: EBPFBackend(pinRoot(t)),
			NFT: nftfilter.Config{Table: table}})
		if err != nil {
			t.Fatalf("New(%s, table %s): %v", mode, table, err)
		}
		t.Cleanup(func() { dp.Close() })
		return dp
	}
	const id = "sbx-tables"
	a := open(ModeNFTables, tableA)
	if err := a.Attach(e.spec(id, basePolicy())); err != nil {
		t.Fatal(err)
	}
	mustNotReach(t, e.tp, dt.Unknown4, 80)

	for _, mode := range []Mode{ModeEBPF, ModeNFTables, ModeAuto} {
		if got := open(mode, tableB).Attached(); len(got) != 0 {
			t.Errorf("%s instance with table %s sees %v, the sandboxes of table %s", mode, tableB, got, tableA)
		}
	}
	if has, err := nftfilter.HasSandboxes(e.tp.Host.Path(), tableB); has || err != nil {
		t.Errorf("HasSandboxes(%s) = %v, %v; want false", tableB, has, err)
	}
	mustNotReach(t, e.tp, dt.Unknown4, 80) // still enforced by the first instance's table

	if got := open(ModeEBPF, tableA).Attached(); !slices.Equal(got, []string{id}) {
		t.Errorf("eBPF instance with table %s manages %v, want [%s] (takes over its nftables sandboxes)", tableA, got, id)
	}
	if err := a.Detach(id); err != nil {
		t.Fatal(err)
	}
}

// TestInvalidTableName: a table name nft could not name is refused in every mode, auto
// included (where nftables failing would otherwise only turn the fallback off).
func TestInvalidTableName(t *testing.T) {
	for _, name := range []string{"1airlock", "air lock", "air;lock", "_x", string(make([]byte, 65))} {
		for _, mode := range []Mode{ModeAuto, ModeEBPF, ModeNFTables} {
			dp, err := New(Config{Mode: mode, NFT: nftfilter.Config{Table: name}})
			if !errors.Is(err, datapath.ErrInvalidSpec) {
				if dp != nil {
					dp.Close()
				}
				t.Errorf("New(%s, table %q) = %v, want ErrInvalidSpec", mode, name, err)
			}
		}
	}
	for _, name := range []string{"airlock", "airlock_t0a1b", "a-b_C9", "x"} {
		if !nftfilter.ValidTableName(name) {
			t.Errorf("ValidTableName(%q) = false", name)
		}
	}
}
