package sandboximage

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/testenv"
)

// TestDesktopImageContents checks the desktop image carries its recipe label, the
// security archive and the newest chromium, declares its ports, and that its entrypoint
// serves noVNC's page and the VNC handshake over websockify's WebSocket on port 6080 of
// the container's address, with a Chromium window on the display and a screenshot of it.
func TestDesktopImageContents(t *testing.T) {
	img := testenv.NeedDesktopImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", "image", "inspect", "--format",
		`{{index .Config.Labels "`+RecipeLabel+`"}} {{range $p, $_ := .Config.ExposedPorts}}{{$p}} {{end}}`, img).Output()
	if err != nil {
		t.Fatalf("inspect %s: %v", img, err)
	}
	if got, want := strings.Join(strings.Fields(string(out)), " "), DesktopRecipe().Hash()+" 5900/tcp 6080/tcp 9222/tcp"; got != want {
		t.Errorf("image label and ports = %q, want %q (stale image: run make image)", got, want)
	}
	// The entrypoint in the background; then, on the container's own address, noVNC's
	// page, the RFB version websockify relays from x11vnc, the windows on the display
	// and a PNG screenshot of it.
	script := `set -e
` + DesktopEntrypoint + ` >/tmp/desktop.log 2>&1 &
ip=$(hostname -i | cut -d' ' -f1)
for i in $(seq 200); do curl -sf http://$ip:6080/vnc.html -o /dev/null && break; sleep 0.1; done
curl -sf http://$ip:6080/vnc.html | grep -o '<title>noVNC</title>'
python3 - "$ip" <<'PY'
import base64, os, socket, sys
s = socket.create_connection((sys.argv[1], 6080), timeout=10)
s.sendall(("GET /websockify HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: binary\r\n\r\n"
           % base64.b64encode(os.urandom(16)).decode()).encode())
buf = b""
while b"RFB" not in buf or not buf.endswith(b"\n"):
    d = s.recv(4096)
    if not d:
        break
    buf += d
print(buf.split(b"\r\n")[0].decode().split(" ")[1], buf[buf.index(b"RFB"):].decode().strip())
PY
for i in $(seq 100); do DISPLAY=:0 wmctrl -l 2>/dev/null | grep -q 'about:blank - Chromium' && break; sleep 0.1; done
DISPLAY=:0 wmctrl -l | cut -d' ' -f5-
` + DesktopScreenshot + ` /tmp/s.png
head -c 8 /tmp/s.png | od -An -c | tr -d ' \n'; echo`
	out, err = exec.CommandContext(ctx, "docker", "run", "--rm", "--shm-size", "256m", img, "bash", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("docker run: %v\n%s", err, out)
	}
	want := `<title>noVNC</title> 101 RFB 003.008 about:blank - Chromium /tmp/s.png 211PNG\r\n032\n`
	if got := strings.Join(strings.Fields(string(out)), " "); got != want {
		t.Errorf("desktop entrypoint:\n got %s\nwant %s", got, want)
	}
	checkSecurityArchive(t, ctx, img)
}

func TestDesktopRecipe(t *testing.T) {
	r := DesktopRecipe()
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, ok := Recipes()["desktop"]; !ok {
		t.Error("`airlock image build desktop` does not know the recipe")
	}
	if r.Security == "" {
		t.Error("the desktop recipe does not take bookworm-security (it runs Chromium)")
	}
	if b := BrowserRecipe(); b.Hash() == r.Hash() || len(b.Expose) != 0 {
		t.Error("the desktop recipe hashes like the browser's, or the browser recipe changed")
	}
	c := DesktopRecipe()
	c.Expose = []int{70000}
	if c.Validate() == nil {
		t.Error("an exposed port above 65535 was accepted")
	}
}
