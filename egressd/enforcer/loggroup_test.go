package enforcer_test

import (
	"testing"

	"github.com/airlockdev/airlock/egressd/enforcer"
	"github.com/airlockdev/airlock/egressd/nftfilter"
)

// The default tables keep group 161; other tables get groups of their own, so two
// egressd on one host (or tests side by side) do not fight over one NFLOG group.
func TestLogGroupFor(t *testing.T) {
	if g := enforcer.LogGroupFor(nftfilter.TableName); g != enforcer.DefaultLogGroup {
		t.Errorf("default tables: group %d, want %d", g, enforcer.DefaultLogGroup)
	}
	if g := enforcer.LogGroupFor(""); g != enforcer.DefaultLogGroup {
		t.Errorf("unnamed tables: group %d, want %d", g, enforcer.DefaultLogGroup)
	}
	a, b := enforcer.LogGroupFor("airlock_t0a1b2c3d"), enforcer.LogGroupFor("airlock_kube")
	for _, g := range []uint16{a, b} {
		if g < 1024 || g == enforcer.DefaultLogGroup {
			t.Errorf("group %d: want one of its own, 1024 or more", g)
		}
	}
	if a == b {
		t.Errorf("two tables share group %d", a)
	}
	if again := enforcer.LogGroupFor("airlock_kube"); again != b {
		t.Errorf("group not stable: %d then %d", b, again)
	}
}
