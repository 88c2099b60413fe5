package console

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"strings"
	"testing"
)

// TestXtermVendored: the xterm.js files under assets/xterm (embedded and served) are
// exactly those console/thirdparty/xterm.sh copied from the pinned npm packages: every
// file listed in thirdparty/xterm.sha256 has its sum, and nothing else is there.
// `console/thirdparty/xterm.sh --check` fetches the packages again and compares.
func TestXtermVendored(t *testing.T) {
	f, err := os.Open("thirdparty/xterm.sha256")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("xterm.sha256: malformed line %q", line)
		}
		want[name] = sum
	}
	for _, name := range []string{"xterm.mjs", "xterm.css", "addon-fit.mjs"} {
		if want[name] == "" {
			t.Errorf("xterm.sha256 does not list %s", name)
		}
	}
	entries, err := fs.ReadDir(assetFS, "assets/xterm")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(want) {
		t.Errorf("assets/xterm holds %d files, xterm.sha256 lists %d", len(entries), len(want))
	}
	for _, e := range entries {
		b, err := fs.ReadFile(assetFS, "assets/xterm/"+e.Name())
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); got != want[e.Name()] {
			t.Errorf("assets/xterm/%s: sha256 %s, the pinned package's %q: run console/thirdparty/xterm.sh", e.Name(), got, want[e.Name()])
		}
	}
}
