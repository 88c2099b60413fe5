// The browser sandbox (airlock/browser) driven over the Chrome DevTools Protocol through
// the gateway, with the published OpenSandbox JavaScript SDK and Playwright
// (playwright-core from npm, no browser of its own: it drives the sandbox's Chromium),
// against a real `airlock up`. The web: a container of this test (airlock/sandbox running
// a small Python server, no Docker network: a veth from the host into its namespace
// carries half of TEST-NET-2) serving two sites by name through the test's fake
// resolver; the sandbox runs under the browser-allowlist preset (deploy/policies) with
// both sites as its additions, so it reaches them and nothing else, and a warm pool of
// the image serves a create with the pool's limits. In the harness's
// external-server mode (AIRLOCK_SDK_LIFECYCLE: see harness.mjs) it runs against an
// installation already up (Airlock on the one-node Kubernetes cluster): the web is a
// Python server on this host at addresses of the interface the sandboxes reach
// (AIRLOCK_SDK_UPSTREAM_DEV), its names the installation's resolver answers (fakeName),
// and the records come from the installation's audit log (auditRecords); the policy is
// the sites alone (the preset is the suite's own library's) and the pool test is skipped
// (an installation's pools are its operator's).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { ConnectionConfig, Sandbox } from "@alibaba-group/opensandbox";
import { chromium } from "playwright-core";
import {
  auditRecords,
  dockerSection,
  EXTERNAL,
  fakeName,
  fakeResolver,
  freePort,
  removeContainers,
  cleanHostState,
  egressHostState,
  startServer,
  stopServer,
} from "./harness.mjs";

const BIN = process.env.AIRLOCK_BIN;
const HOST_STATE = egressHostState("browser");
const IMAGE = process.env.AIRLOCK_BROWSER_IMAGE ?? "airlock/browser:latest";
const WEB_IMAGE = process.env.AIRLOCK_TEST_IMAGE ?? "airlock/sandbox:latest";
const RUN = `browser${process.pid}`;
const PREFIX = `altest-sdk-browser${process.pid}-`;
const CDP = 9222;
// The gateway's base domain for host-form routes: airlock.localhost with the suite's own
// server; an installation already up names its own (none: the host form is not checked).
const BASE_DOMAIN = EXTERNAL ? process.env.AIRLOCK_SDK_BASE_DOMAIN : "airlock.localhost";
// The datapath under test: the suite runs once per backend (package.json).
const MODE = process.env.AIRLOCK_EGRESS_MODE ?? "ebpf";
// The web: 198.51.100.128/25, routed from the host into the web container's namespace.
const HOST_IF = `albh${process.pid}`;
const PEER_IF = `albp${process.pid}`;
const HOST_IP = "198.51.100.129";
const SITE_A = "198.51.100.140";
const SITE_B = "198.51.100.141";
const DENIED = "198.51.100.150";
// The sites' names as sandboxes resolve them.
const NAME_A = fakeName("site-a.test");
const NAME_B = fakeName("site-b.test");
const NAME_DENIED = fakeName("denied.test");
// The browser preset of the policy library, and the warm pool's limits.
const PRESET = "browser-allowlist";
const POOL_LIMITS = { cpu: "1", memory: "1Gi" };
const SITES = {
  defaultAction: "deny",
  egress: [{ action: "allow", target: NAME_A }, { action: "allow", target: NAME_B }],
};
// The preset, with this task's sites as its additions (the suite's own server only).
const POLICY = EXTERNAL ? { networkPolicy: SITES } : { extensions: { "airlock.dev/policy": PRESET }, networkPolicy: SITES };

let dir;
let server;
let apiKey;
let domain;
let gateway;
let resolver;
let sbx;
let browser;
let webProc; // the web server on this host (external-server mode)
let webOut = "";

function sh(cmd, args) {
  return execFileSync(cmd, args, { stdio: ["ignore", "pipe", "pipe"] }).toString();
}

function config() {
  return new ConnectionConfig({ domain, apiKey, requestTimeoutSeconds: 60 });
}

// web starts the web container: a Python server answering on SITE_A and SITE_B, each
// with its own page (site A links to site B), reached through a veth from the host.
function web() {
  writeFileSync(`${dir}/server.py`, `
import http.server, socketserver, threading, time
PAGES = {
    "${SITE_A}": "<html><head><title>Airlock site A</title></head><body><h1>A</h1><a id=next href='http://${NAME_B}/'>to B</a></body></html>",
    "${SITE_B}": "<html><head><title>Airlock site B</title></head><body><h1>B</h1></body></html>",
}
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = PAGES[self.server.server_address[0]].encode()
        self.send_response(200 if self.path == "/" else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
socketserver.ThreadingTCPServer.allow_reuse_address = True
# The addresses arrive with the veth, after the container started.
for ip in PAGES:
    for i in range(300):
        try:
            s = socketserver.ThreadingTCPServer((ip, 80), H)
            break
        except OSError:
            time.sleep(0.1)
    threading.Thread(target=s.serve_forever, daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
`);
  if (EXTERNAL) {
    // On this host, at addresses of the interface the sandboxes reach.
    for (const ip of [SITE_A, SITE_B]) sh("ip", ["addr", "add", `${ip}/32`, "dev", EXTERNAL.upstreamDev]);
    webProc = spawn("python3", [`${dir}/server.py`], { stdio: ["ignore", "pipe", "pipe"] });
    webProc.stdout.on("data", (d) => (webOut += d));
    webProc.stderr.on("data", (d) => (webOut += d));
    return;
  }
  const name = `${PREFIX}web`;
  sh("docker", ["run", "-d", "--name", name, "--network", "none", "-v", `${dir}/server.py:/srv/server.py:ro`,
    WEB_IMAGE, "python3", "/srv/server.py"]);
  const pid = sh("docker", ["inspect", "-f", "{{.State.Pid}}", name]).trim();
  sh("ip", ["link", "add", HOST_IF, "type", "veth", "peer", "name", PEER_IF]);
  sh("ip", ["link", "set", PEER_IF, "netns", pid]);
  sh("ip", ["addr", "add", `${HOST_IP}/25`, "dev", HOST_IF]);
  sh("ip", ["link", "set", HOST_IF, "up"]);
  const inNs = (...args) => sh("nsenter", ["-t", pid, "-n", "ip", ...args]);
  inNs("addr", "add", `${SITE_A}/25`, "dev", PEER_IF);
  inNs("addr", "add", `${SITE_B}/25`, "dev", PEER_IF);
  inNs("link", "set", PEER_IF, "up");
  inNs("route", "add", "default", "via", HOST_IP);
}

async function webReady() {
  if (EXTERNAL) {
    for (let i = 0; i < 100 && !webOut.includes("listening"); i++) await new Promise((r) => setTimeout(r, 100));
    if (!webOut.includes("listening")) throw new Error(`web server not listening: ${webOut}`);
    return;
  }
  for (let i = 0; i < 100; i++) {
    if (sh("docker", ["logs", `${PREFIX}web`]).includes("listening")) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`web container not listening: ${sh("docker", ["logs", `${PREFIX}web`])}`);
}

before(async () => {
  assert.ok(BIN || EXTERNAL, "AIRLOCK_BIN must name the airlock binary (make sdk-test sets it)");
  dir = mkdtempSync(path.join(os.tmpdir(), "airlock-browser-"));
  if (!EXTERNAL) removeContainers(PREFIX);
  try { sh("ip", ["link", "del", HOST_IF]); } catch {}
  web();
  await webReady();
  if (EXTERNAL) {
    ({ domain, gateway, apiKey } = EXTERNAL);
    return;
  }
  resolver = await fakeResolver({
    "site-a.test": SITE_A.split(".").map(Number),
    "site-b.test": SITE_B.split(".").map(Number),
    "denied.test": DENIED.split(".").map(Number),
  });
  domain = `127.0.0.1:${await freePort()}`;
  gateway = `127.0.0.1:${await freePort()}`;
  mkdirSync(`${dir}/policies`);
  copyFileSync(new URL(`../../deploy/policies/${PRESET}.yaml`, import.meta.url), `${dir}/policies/${PRESET}.yaml`);
  const lines = [
    `listen: ${domain}`,
    `stateDir: ${dir}/state`,
    "gateway:",
    `  listen: ${gateway}`,
    "egress:",
    `  mode: ${MODE}`,
    `  upstreams: [127.0.0.1:${resolver.address().port}]`,
    ...HOST_STATE.lines,
    "policies:",
    `  dir: ${dir}/policies`,
    "pools:",
    "  - name: browser",
    `    image: ${IMAGE}`,
    "    size: 1",
    `    resourceLimits: {cpu: "${POOL_LIMITS.cpu}", memory: "${POOL_LIMITS.memory}"}`,
    "    entrypoint: [/opt/airlock/browser.sh]",
    "    readyPort: 9222",
    "    readyPath: /json/version",
  ];
  lines.push(...dockerSection(PREFIX));
  writeFileSync(`${dir}/airlock.yaml`, lines.join("\n") + "\n");
  ({ proc: server, apiKey } = await startServer(BIN, `${dir}/airlock.yaml`));
});

after(async () => {
  // Disconnect (bounded: the sandbox and its Chromium go with the kill below).
  if (browser) await Promise.race([browser.close().catch(() => {}), new Promise((r) => setTimeout(r, 5000))]);
  if (sbx) await sbx.kill().catch(() => {});
  if (server) await stopServer(server);
  if (webProc) webProc.kill();
  if (EXTERNAL) {
    for (const ip of [SITE_A, SITE_B]) {
      try { sh("ip", ["addr", "del", `${ip}/32`, "dev", EXTERNAL.upstreamDev]); } catch {}
    }
  } else {
    removeContainers(PREFIX);
  }
  try { sh("ip", ["link", "del", HOST_IF]); } catch {}
  if (resolver) resolver.close();
  cleanHostState(BIN, HOST_STATE);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test(`[${MODE}] a browser sandbox's DevTools endpoint needs the sandbox's credential`, async () => {
  const started = Date.now();
  sbx = await Sandbox.create({
    connectionConfig: config(),
    image: IMAGE,
    resource: EXTERNAL?.resource,
    entrypoint: ["/opt/airlock/browser.sh"],
    metadata: { suite: RUN },
    ...POLICY,
    timeoutSeconds: 600,
    readyTimeoutSeconds: 60,
  });
  const ep = await sbx.getEndpoint(CDP);
  assert.equal(ep.endpoint, `${gateway}/sandboxes/${sbx.id}/proxy/${CDP}`, "the DevTools port gets a path-form endpoint");
  assert.match(ep.headers?.["OpenSandbox-Secure-Access"] ?? "", /^[0-9a-f]{64}$/, JSON.stringify(ep));
  let version;
  for (let i = 0; i < 150; i++) {
    const res = await fetch(`http://${ep.endpoint}/json/version`, { headers: ep.headers });
    if (res.status === 200) {
      version = await res.json();
      break;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.ok(version, "/json/version answered through the gateway");
  console.log(`# browser sandbox create → CDP ready: ${Date.now() - started} ms (${version.Browser})`);
  assert.match(version.Browser, /Chrome/);
  assert.match(version.webSocketDebuggerUrl, new RegExp(`^ws://${gateway}/sandboxes/${sbx.id}/proxy/${CDP}/devtools/browser/`));
  const list = await (await fetch(`http://${ep.endpoint}/json/list`, { headers: ep.headers })).json();
  assert.ok(list.length >= 1, JSON.stringify(list));
  for (const t of list) {
    assert.ok(t.webSocketDebuggerUrl.startsWith(`ws://${gateway}/sandboxes/${sbx.id}/proxy/${CDP}/devtools/`), JSON.stringify(t));
  }
  // Anonymous: 401 through the path form, the host form, the header forms and
  // lifecycle's server proxy.
  const [gwHost, gwPort] = gateway.split(":");
  const anon = [
    [`http://${ep.endpoint}/json/version`, {}],
    [`http://${gateway}/${sbx.id}/${CDP}/json/version`, {}],
    [`http://${gateway}/json/version`, { "OpenSandbox-Ingress-To": `${sbx.id}-${CDP}` }],
    [`http://${gateway}/json/version`, { "X-Airlock-Sandbox": sbx.id, "X-Airlock-Port": `${CDP}` }],
    [`http://${domain}/sandboxes/${sbx.id}/proxy/${CDP}/json/version`, {}],
  ];
  for (const [url, headers] of anon) {
    const res = await fetch(url, { headers });
    assert.equal(res.status, 401, `${url} ${JSON.stringify(headers)}`);
  }
  // The host form, by Host header (*.airlock.localhost needs no resolver of its own).
  // An installation already up serves it only under its base domain
  // (AIRLOCK_SDK_BASE_DOMAIN; Kubernetes' default is none: path and header routes).
  if (!BASE_DOMAIN) {
    console.log("# skipped in external-server mode: the host form (no AIRLOCK_SDK_BASE_DOMAIN)");
    return;
  }
  const hostName = `${CDP}-${sbx.id}.${BASE_DOMAIN}:${gwPort}`;
  const hostRes = await rawGet(gwHost, gwPort, hostName, "/json/version");
  assert.equal(hostRes.status, 401);
  const hostOK = await rawGet(gwHost, gwPort, hostName, "/json/version", ep.headers);
  assert.equal(hostOK.status, 200, hostOK.body);
  assert.match(JSON.parse(hostOK.body).webSocketDebuggerUrl,
    new RegExp(`^ws://${CDP}-${sbx.id}\\.${BASE_DOMAIN.replaceAll(".", "\\.")}:${gwPort}/devtools/browser/`));
});

// rawGet sends one GET to host:port with the given Host header (fetch cannot set Host).
async function rawGet(host, port, hostHeader, path, headers = {}) {
  const net = await import("node:net");
  return new Promise((resolve, reject) => {
    const c = net.connect(Number(port), host, () => {
      const extra = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join("");
      c.write(`GET ${path} HTTP/1.1\r\nHost: ${hostHeader}\r\n${extra}Connection: close\r\n\r\n`);
    });
    let data = "";
    c.on("data", (d) => (data += d));
    c.on("end", () => {
      const [head, ...rest] = data.split("\r\n\r\n");
      resolve({ status: Number(head.split(" ")[1]), body: rest.join("\r\n\r\n") });
    });
    c.on("error", reject);
  });
}

test(`[${MODE}] Playwright drives the sandbox's Chromium over CDP through the gateway, under the policy`, async () => {
  const ep = await sbx.getEndpoint(CDP);
  browser = await chromium.connectOverCDP(`http://${ep.endpoint}`, { headers: ep.headers, timeout: 30_000 });
  const context = browser.contexts()[0] ?? (await browser.newContext());
  const page = await context.newPage();
  await page.goto(`http://${NAME_A}/`, { timeout: 15_000 });
  assert.equal(await page.title(), "Airlock site A");
  const shot = await page.screenshot();
  assert.ok(shot.length > 1000 && shot.subarray(1, 4).toString() === "PNG", `a PNG screenshot (${shot.length} bytes)`);
  await Promise.all([page.waitForURL(`http://${NAME_B}/`, { timeout: 15_000 }), page.click("#next")]);
  assert.equal(await page.title(), "Airlock site B");

  const t0 = Date.now();
  const err = await page.goto(`http://${NAME_DENIED}/`, { timeout: 5_000 }).then(() => null, (e) => e);
  const took = Date.now() - t0;
  assert.match(String(err?.message), /net::ERR_NAME_NOT_RESOLVED/, "the denied name does not resolve");
  console.log(`# denied navigation failed in ${took} ms (${String(err.message).split("\n")[0]})`);
  assert.ok(took < 1000, `a denied navigation fails within 1 s (took ${took} ms)`);

  // An address no allowed name gave: refused fast. Under the preset's `l7: sni`, plain
  // HTTP goes to egressd's L7 proxy, which answers a denied request with its 403;
  // otherwise the datapath refuses the flow and Chromium fails with a network error.
  const page2 = await context.newPage();
  const t1 = Date.now();
  const res2 = await page2.goto(`http://${DENIED}/`, { timeout: 5_000 }).then((r) => r, (e) => e);
  const took2 = Date.now() - t1;
  if (res2 instanceof Error) {
    console.log(`# denied address failed in ${took2} ms (${String(res2.message).split("\n")[0]})`);
    assert.match(String(res2.message), /net::ERR_/);
  } else {
    const body = await res2.text();
    console.log(`# denied address refused in ${took2} ms (${res2.status()} ${body.trim()})`);
    assert.equal(res2.status(), 403);
    assert.match(body, /blocked by the egress policy/);
  }
  assert.ok(took2 < 1000, `a denied address is refused within 1 s (took ${took2} ms)`);

  // A Google endpoint of Chromium's background services: the preset denies it by name.
  if (!EXTERNAL) {
    const t2 = Date.now();
    const err3 = await page2.goto("https://update.googleapis.com/service/update2/json", { timeout: 5_000 }).then(() => null, (e) => e);
    console.log(`# update.googleapis.com failed in ${Date.now() - t2} ms (${String(err3?.message).split("\n")[0]})`);
    assert.match(String(err3?.message), /net::ERR_NAME_NOT_RESOLVED/);
  }

  // The audit log: the allowed hosts and the denial, with the host.
  const seen = (records, action, host) =>
    records.some((r) => r.action === action && (r.dst_host ?? "").replace(/\.$/, "") === host);
  let records = [];
  for (let i = 0; i < 50; i++) {
    records = await auditRecords(domain, apiKey, sbx.id);
    if (seen(records, "allow", NAME_A) && seen(records, "allow", NAME_B) && seen(records, "deny", NAME_DENIED) &&
      (EXTERNAL || seen(records, "deny", "update.googleapis.com"))) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  const triples = [...new Set(records.map((r) => `${r.source} ${r.action} ${r.dst_host ?? ""}`))];
  console.log(`# audit: ${triples.join("; ")}`);
  assert.ok(seen(records, "allow", NAME_A), `${NAME_A} allowed on record`);
  assert.ok(seen(records, "allow", NAME_B), `${NAME_B} allowed on record`);
  assert.ok(seen(records, "deny", NAME_DENIED), `${NAME_DENIED} denied on record`);
  if (EXTERNAL) return;
  // Denied by the preset's rule, which the record names; Chromium's own background
  // calls that remain despite its switches are there too.
  const google = records.filter((r) => r.action === "deny" && /(^|\.)(google\.com|googleapis\.com)\.?$/.test(r.dst_host ?? ""));
  console.log(`# denied Google names: ${[...new Set(google.map((r) => `${r.dst_host} (${r.reason})`))].join("; ")}`);
  const upd = google.find((r) => (r.dst_host ?? "").replace(/\.$/, "") === "update.googleapis.com");
  assert.ok(upd, "update.googleapis.com denied on record");
  assert.match(upd.reason ?? "", /^deny \*\.googleapis\.com \(/, JSON.stringify(upd));
});

test(`[${MODE}] a browser sandbox claimed from a warm pool drives Chromium over CDP`, { skip: EXTERNAL ? "external-server mode: an installation's warm pools are its operator's" : false }, async () => {
  const started = Date.now();
  const pooled = await Sandbox.create({
    connectionConfig: config(),
    image: IMAGE,
    entrypoint: ["/opt/airlock/browser.sh"],
    resource: POOL_LIMITS,
    metadata: { suite: RUN },
    ...POLICY,
    timeoutSeconds: 600,
    readyTimeoutSeconds: 60,
  });
  let pb;
  try {
    const info = await pooled.getInfo();
    assert.match(info.status?.message ?? "", /warm pool browser/, `served by the pool: ${JSON.stringify(info.status)}`);
    const ep = await pooled.getEndpoint(CDP);
    const anon = await fetch(`http://${ep.endpoint}/json/version`);
    assert.equal(anon.status, 401);
    for (let i = 0; i < 300; i++) {
      if ((await fetch(`http://${ep.endpoint}/json/version`, { headers: ep.headers })).status === 200) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    console.log(`# pooled browser sandbox create → CDP ready: ${Date.now() - started} ms`);
    pb = await chromium.connectOverCDP(`http://${ep.endpoint}`, { headers: ep.headers, timeout: 30_000 });
    const page = await (pb.contexts()[0] ?? (await pb.newContext())).newPage();
    await page.goto(`http://${NAME_A}/`, { timeout: 15_000 });
    assert.equal(await page.title(), "Airlock site A");
    assert.equal(await page.evaluate(() => 1 + 1), 2);
  } finally {
    if (pb) await Promise.race([pb.close().catch(() => {}), new Promise((r) => setTimeout(r, 5000))]);
    await pooled.kill().catch(() => {});
  }
});
