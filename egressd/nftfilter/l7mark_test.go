package nftfilter

import (
	"testing"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// TestL7MarkFor: the default tables keep the default mark; other names get marks of
// their own under the same mask, never zero nor the default, stable per name.
func TestL7MarkFor(t *testing.T) {
	for _, name := range []string{"", TableName} {
		if m, k := L7MarkFor(name); m != datapath.DefaultL7Mark || k != datapath.DefaultL7MarkMask {
			t.Errorf("L7MarkFor(%q) = %#x/%#x, want the default", name, m, k)
		}
	}
	seen := map[uint32]string{}
	for _, name := range []string{"airlockkube", "altest_sdk_1", "altest_sdk_2", "airlock_t0a1b2c3d", "airlock_b"} {
		m, k := L7MarkFor(name)
		if k != datapath.DefaultL7MarkMask || m&^k != 0 || m == 0 || m == datapath.DefaultL7Mark {
			t.Errorf("L7MarkFor(%q) = %#x/%#x", name, m, k)
		}
		if other, ok := seen[m]; ok {
			t.Errorf("%q and %q share the mark %#x", name, other, m)
		}
		seen[m] = name
		if again, _ := L7MarkFor(name); again != m {
			t.Errorf("L7MarkFor(%q) is not stable: %#x then %#x", name, m, again)
		}
	}
}
