package sandboximage

import _ "embed"

//go:embed desktop.sh
var desktopScript string

// DesktopRepository is the desktop image's name.
const DesktopRepository = "airlock/desktop"

// DesktopEntrypoint is the desktop image's entrypoint script (desktop.sh): Xvfb on
// display :0, the fluxbox window manager, Chromium (not headless, DevTools on
// BrowserCDPPort), x11vnc on DesktopVNCPort and websockify serving noVNC on
// DesktopNoVNCPort. A sandbox runs it when its create request names it as the
// entrypoint.
const DesktopEntrypoint = "/opt/airlock/desktop.sh"

// DesktopScreenshot is a script in the desktop image that writes a PNG of the whole
// display (scrot) to the file its argument names (default /tmp/desktop.png) and prints
// that path.
const DesktopScreenshot = "/opt/airlock/screenshot.sh"

// DesktopVNCPort is the VNC (RFB 3.8, no password: the gateway's credential is the gate)
// port of a sandbox running DesktopEntrypoint.
const DesktopVNCPort = 5900

// DesktopNoVNCPort is the port where websockify serves noVNC's web page (/vnc.html,
// /vnc_lite.html) and, on any other path asked with a WebSocket upgrade (noVNC uses
// /websockify), the VNC stream in binary WebSocket frames.
const DesktopNoVNCPort = 6080

const screenshotScript = `#!/bin/sh
# airlock/desktop: a PNG of the whole display ($DISPLAY, default :0) into $1
# (default /tmp/desktop.png); prints the file's path.
set -e
out=${1:-/tmp/desktop.png}
DISPLAY=${DISPLAY:-:0} scrot --overwrite "$out"
echo "$out"
`

// DesktopRecipe is the desktop image: the browser image's packages (Chromium from
// bookworm-security, fonts, socat) plus Xvfb, x11vnc, noVNC with websockify, the fluxbox
// window manager, scrot (screenshots), xdotool and wmctrl (windows from scripts), with
// DesktopEntrypoint and DesktopScreenshot. It declares ports 5900, 6080 and 9222.
func DesktopRecipe() Recipe {
	r := BrowserRecipe()
	r.Repository = DesktopRepository
	r.Packages = append(r.Packages, "xvfb", "x11vnc", "novnc", "websockify", "fluxbox",
		"scrot", "xdotool", "wmctrl")
	r.Files = map[string]string{DesktopEntrypoint: desktopScript, DesktopScreenshot: screenshotScript,
		// fluxbox's wallpaper setter, which would find no image tool and open a message
		// window on the desktop: the entrypoint puts this directory first in its PATH.
		"/opt/airlock/bin/fbsetbg": "#!/bin/sh\n# airlock/desktop: no wallpaper.\nexit 0\n"}
	r.Expose = []int{DesktopVNCPort, DesktopNoVNCPort, BrowserCDPPort}
	r.Verify = `set -e
test -x /usr/lib/chromium/chromium
for c in Xvfb x11vnc websockify fluxbox scrot xdotool wmctrl socat; do command -v $c >/dev/null; done
test -f /usr/share/novnc/vnc.html
test -f /usr/share/novnc/vnc_lite.html
test -x ` + DesktopEntrypoint + `
test -x ` + DesktopScreenshot + `
ls /usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf`
	return r
}
