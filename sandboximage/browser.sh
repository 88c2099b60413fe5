#!/bin/bash
# airlock/browser entrypoint (Airlock): headless Chromium with the Chrome DevTools
# Protocol on port 9222 of the sandbox's address, for clients such as Playwright's
# chromium.connectOverCDP through Airlock's gateway. Run it as the sandbox's entrypoint
# (execd starts it): ["/opt/airlock/browser.sh"]; extra arguments go to Chromium.
#
# Chromium's headless mode binds remote debugging to 127.0.0.1 whatever
# --remote-debugging-address says, so Chromium listens on 127.0.0.1:$CDP_INNER_PORT
# and socat forwards the sandbox's port $CDP_PORT to it. Chromium refuses requests whose
# Host is not an IP address or localhost: the gateway sends the sandbox's address as Host
# on this port and rewrites the WebSocket URLs in the /json answers to its own.
#
# Everything the browser fetches goes through the sandbox's egress policy; background
# services (updates, safe browsing, metrics, sync) are off so that only the pages asked
# for are fetched. The switches and features below are those Playwright's launcher
# uses for the same purpose (playwright-core's chromiumSwitches): NetworkTimeServiceQuerying
# (clients2.google.com), AimEnabled and PreconnectToSearch (www.google.com),
# SkipListAccountsWithoutGaiaCookies (accounts.google.com's ListAccounts), extensions and
# default apps (their update checks), field trials (a trial can turn a feature back on).
# The browser-allowlist policy (deploy/policies) denies what remains by name.
set -u
CDP_PORT=${CDP_PORT:-9222}
CDP_INNER_PORT=${CDP_INNER_PORT:-9223}
profile=$(mktemp -d /tmp/chromium-XXXXXX)
chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
	--no-first-run --no-default-browser-check --disable-background-networking \
	--disable-component-update --disable-sync --disable-breakpad --disable-domain-reliability \
	--disable-client-side-phishing-detection --disable-field-trial-config \
	--disable-extensions --disable-default-apps --disable-component-extensions-with-background-pages \
	--no-service-autorun --no-pings --disable-search-engine-choice-screen --disable-quic \
	--disable-features=Translate,MediaRouter,OptimizationHints,OptimizationHintsFetching,OptimizationGuideModelDownloading,OptimizationTargetPrediction,NetworkTimeServiceQuerying,AimEnabled,PreconnectToSearch,AutofillServerCommunication,CertificateTransparencyComponentUpdater,InterestFeedContentSuggestions,DnsOverHttps \
	--enable-features=SkipListAccountsWithoutGaiaCookies \
	--metrics-recording-only --password-store=basic --use-mock-keychain \
	--remote-debugging-port="$CDP_INNER_PORT" --remote-allow-origins='*' \
	--user-data-dir="$profile" --window-size=1280,800 "$@" about:blank &
# $CDP_PORT listens only once Chromium does, so that a connection to it (a warm pool's
# readiness check, lifecycle's readyPort) means DevTools answers.
for _ in $(seq 1 500); do
	(exec 3<>"/dev/tcp/127.0.0.1/$CDP_INNER_PORT") 2>/dev/null && break
	sleep 0.02
done
socat TCP-LISTEN:"$CDP_PORT",fork,reuseaddr TCP:127.0.0.1:"$CDP_INNER_PORT" &
# Whichever ends first ends the sandbox's entrypoint.
wait -n
