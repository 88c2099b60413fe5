#!/bin/bash
# airlock/desktop entrypoint (Airlock): a desktop session on display :0 (Xvfb, the
# fluxbox window manager, Chromium) served over VNC (x11vnc, port 5900) and noVNC
# (websockify: noVNC's web page and its WebSocket on port 6080). Run it as the
# sandbox's entrypoint (execd starts it): ["/opt/airlock/desktop.sh"]; extra arguments
# go to Chromium.
#
# No VNC password: both ports are control ports, so the gateway admits only the
# sandbox's credential (token header or signed URL) on every routing form. Chromium's
# DevTools protocol is on port 9222 as in airlock/browser (socat to 127.0.0.1:9223).
#
# Environment: DISPLAY (:0), GEOMETRY (1280x800x24), VNC_PORT (5900), NOVNC_PORT
# (6080), CDP_PORT (9222), CDP_INNER_PORT (9223), CHROMIUM_PROFILE
# (/tmp/chromium-desktop: `chromium --user-data-dir=$CHROMIUM_PROFILE URL` opens URL
# in the running browser).
set -u
export DISPLAY=${DISPLAY:-:0}
GEOMETRY=${GEOMETRY:-1280x800x24}
VNC_PORT=${VNC_PORT:-5900}
NOVNC_PORT=${NOVNC_PORT:-6080}
CDP_PORT=${CDP_PORT:-9222}
CDP_INNER_PORT=${CDP_INNER_PORT:-9223}
CHROMIUM_PROFILE=${CHROMIUM_PROFILE:-/tmp/chromium-desktop}
n=${DISPLAY#:}
n=${n%%.*}

Xvfb "$DISPLAY" -screen 0 "$GEOMETRY" -nolisten tcp -dpi 96 &
xvfb=$!
for _ in $(seq 100); do
	[ -S "/tmp/.X11-unix/X$n" ] && break
	sleep 0.05
done
# No wallpaper: fluxbox calls fbsetbg, which finds no image setter in this image and
# opens a message window on the desktop; /opt/airlock/bin has a fbsetbg that does nothing.
PATH=/opt/airlock/bin:$PATH fluxbox >/tmp/fluxbox.log 2>&1 &
x11vnc -display "$DISPLAY" -rfbport "$VNC_PORT" -forever -shared -nopw -quiet \
	-noxdamage -wait 20 >/tmp/x11vnc.log 2>&1 &
vnc=$!
# websockify's page is the desktop's readiness: serve it once VNC listens, so that a
# client that got the page also gets the VNC stream.
for _ in $(seq 200); do
	ss -Hltn "sport = :$VNC_PORT" | grep -q . && break
	sleep 0.05
done
websockify --web /usr/share/novnc "$NOVNC_PORT" 127.0.0.1:"$VNC_PORT" >/tmp/websockify.log 2>&1 &
novnc=$!
mkdir -p "$CHROMIUM_PROFILE"
chromium --no-sandbox --disable-gpu --disable-dev-shm-usage \
	--no-first-run --no-default-browser-check --disable-background-networking \
	--disable-component-update --disable-sync --disable-breakpad --disable-domain-reliability \
	--disable-client-side-phishing-detection --disable-features=Translate,MediaRouter,OptimizationHints \
	--metrics-recording-only --password-store=basic --use-mock-keychain \
	--remote-debugging-port="$CDP_INNER_PORT" --remote-allow-origins='*' \
	--user-data-dir="$CHROMIUM_PROFILE" --window-position=0,0 --window-size=1280,760 "$@" about:blank \
	>/tmp/chromium.log 2>&1 &
socat TCP-LISTEN:"$CDP_PORT",fork,reuseaddr TCP:127.0.0.1:"$CDP_INNER_PORT" &
# The desktop lives as long as its display, VNC and noVNC servers: whichever of the
# long-lived processes ends first ends the entrypoint (a closed Chromium window does not).
wait -n "$xvfb" "$vnc" "$novnc"
