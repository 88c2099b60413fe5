// Package nfttest gives each test that starts an egressd its own nftables tables. It
// lives beside nftfilter, not in internal/testenv, so that testenv imports nothing of
// egressd: egressd's own tests import testenv, and a testenv that imported nftfilter
// would close a loop between the two folders (internal/archtest checks there is none).
package nfttest

import (
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/airlockdev/airlock/egressd/nftfilter"
)

// Table returns a name for the nftables tables (nftfilter.Config.Table) of one egressd
// the test starts in the host's network namespace, unique to the test, and removes
// those tables at cleanup. Tests of several packages run at once, and an egressd
// adopts (and detaches, as not its own) every sandbox it finds in its tables: each
// test's egressd needs its own, as it needs its own eBPF pin root.
func Table(t testing.TB) string {
	t.Helper()
	var b [4]byte
	rand.Read(b[:])
	name := "airlock_t" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if _, err := nftfilter.RemoveTable("", name); err != nil {
			t.Logf("removing the test's nftables tables %s: %v", name, err)
		}
	})
	return name
}
