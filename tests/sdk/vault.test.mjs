// The Credential Vault (OSEP-0012) through the published OpenSandbox JavaScript SDK
// against a real `airlock up`: a sandbox created with credentialProxy.enabled reaches an
// HTTPS echo server (its own test CA, in a network namespace this test creates and
// routes from the host, behind a name the test's fake resolver serves), and the echo
// server sees exactly the headers the vault's bindings inject. The secret is then
// searched for everywhere outside the sealed store. In the harness's external-server
// mode (AIRLOCK_SDK_LIFECYCLE: see harness.mjs) it runs against an installation already
// up (Airlock on the one-node Kubernetes cluster, internal/kubenode TestSDKSuitesOnNode):
// echo.test and plain.test are the names the cluster DNS answers with the echo address
// (fakeName), the servers' network namespace is routed from the host as with a server of
// the suite's own (not addresses of the node itself, which egressd denies once it
// restarts; the installation forwards between its sandboxes and 203.0.113.128/25:
// internal/kubenode accepts that in the node's FORWARD chain), their certificates come
// from the CA the installation trusts, the secrets are searched for in the node's state and the records read from
// its audit log; the tests that read the log of, restart or reconfigure `airlock up` do so
// through the installation's control interface (AIRLOCK_SDK_CONTROL: on the node, to its
// egressd, which holds the vault's sealed store in the node's state) and are skipped, the
// reason printed, without one.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { ConnectionConfig, Sandbox, SandboxException } from "@alibaba-group/opensandbox";
import {
  auditRecords,
  control,
  dockerSection,
  EXTERNAL,
  fakeName,
  fakeResolver,
  freePort,
  ownServerOrControl,
  removeContainers,
  cleanHostState,
  egressHostState,
  startServer,
  stopServer,
} from "./harness.mjs";

const BIN = process.env.AIRLOCK_BIN;
const HOST_STATE = egressHostState("vault");
const IMAGE = process.env.AIRLOCK_TEST_IMAGE ?? "airlock/sandbox:latest";
const RUN = `vault${process.pid}`;
const PREFIX = `altest-sdk-vault${process.pid}-`;
// The datapath under test: the suite runs once per backend (package.json).
const MODE = process.env.AIRLOCK_EGRESS_MODE ?? "ebpf";
// The echo servers' names as sandboxes resolve them (both answer ECHO_IP).
const ECHO = fakeName("echo.test");
const PLAIN = fakeName("plain.test");
const SECRET = `sk-airlock-vault-${randomBytes(12).toString("hex")}`;
const SECRET2 = `key-airlock-vault-${randomBytes(12).toString("hex")}`;

// The "internet": half of TEST-NET-3, routed from the host into a namespace of this test.
const NS = `alv${process.pid}`;
const HOST_IF = `alvh${process.pid}`;
const PEER_IF = `alvp${process.pid}`;
const HOST_IP = "203.0.113.129";
const ECHO_IP = "203.0.113.180";
// The same echo servers at an address no DNS answer gives (the sandbox chooses it with
// curl --resolve or /etc/hosts), and a server whose certificate names other.test only.
const CHOSEN_IP = "203.0.113.181";
const WRONG_IP = "203.0.113.182";

let dir;
let cfgPath;
let server;
let serverLog = () => "";
let apiKey;
let domain;
let resolver;
let echo;
let sbx;
let sbxOpen; // default-allow policy, credentialProxy on
let upstreamLog = ""; // one JSON line per request any upstream server saw
const responses = []; // every vault API answer, searched for the secrets at the end

function sh(cmd, args, opts = {}) {
  return execFileSync(cmd, args, { stdio: ["ignore", "pipe", "pipe"], ...opts }).toString();
}

function config() {
  return new ConnectionConfig({ domain, apiKey, requestTimeoutSeconds: 60 });
}

// makeCerts writes a test CA and a leaf for echo.test and plain.test with openssl.
function makeCerts() {
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  if (EXTERNAL) {
    // The CA the installation already trusts for intercepted upstreams.
    assert.ok(EXTERNAL.upstreamCA && EXTERNAL.upstreamCAKey, "AIRLOCK_SDK_UPSTREAM_CA and AIRLOCK_SDK_UPSTREAM_CA_KEY must be set");
    writeFileSync(`${dir}/ca.crt`, readFileSync(EXTERNAL.upstreamCA));
    writeFileSync(`${dir}/ca.key`, readFileSync(EXTERNAL.upstreamCAKey));
  } else {
    sh("openssl", ["req", "-x509", ...ec, "-keyout", `${dir}/ca.key`, "-out", `${dir}/ca.crt`, "-days", "2", "-subj", "/CN=airlock-sdk-test-ca"]);
  }
  sh("openssl", ["req", ...ec, "-keyout", `${dir}/echo.key`, "-out", `${dir}/echo.csr`, "-subj", "/CN=echo.test"]);
  writeFileSync(`${dir}/san.ext`, `subjectAltName=DNS:${ECHO},DNS:${PLAIN}\n`);
  sh("openssl", ["x509", "-req", "-in", `${dir}/echo.csr`, "-CA", `${dir}/ca.crt`, "-CAkey", `${dir}/ca.key`,
    "-CAcreateserial", "-out", `${dir}/echo.crt`, "-days", "2", "-extfile", `${dir}/san.ext`]);
  // The same test CA vouches for other.test: trusted, but not echo.test.
  sh("openssl", ["req", ...ec, "-keyout", `${dir}/other.key`, "-out", `${dir}/other.csr`, "-subj", "/CN=other.test"]);
  writeFileSync(`${dir}/other.ext`, "subjectAltName=DNS:other.test\n");
  sh("openssl", ["x509", "-req", "-in", `${dir}/other.csr`, "-CA", `${dir}/ca.crt`, "-CAkey", `${dir}/ca.key`,
    "-CAcreateserial", "-out", `${dir}/other.crt`, "-days", "2", "-extfile", `${dir}/other.ext`]);
}

// startEcho runs, in the test's namespace, HTTPS (443) and HTTP (80) echo servers on
// ECHO_IP and CHOSEN_IP that answer every request with the server, method, path and
// headers as JSON, and on WRONG_IP an HTTPS server with a certificate for other.test
// only. Every request any of them sees is also printed as a JSON line (upstreamLog).
function startEcho() {
  const src = `
import http from "node:http";
import https from "node:https";
import { readFileSync } from "node:fs";
const tls = (n) => ({ key: readFileSync(${JSON.stringify(dir)} + "/" + n + ".key"), cert: readFileSync(${JSON.stringify(dir)} + "/" + n + ".crt") });
const handler = (server) => (req, res) => {
  const seen = { server, method: req.method, path: req.url, headers: req.headers };
  console.log(JSON.stringify(seen));
  res.setHeader("content-type", "application/json");
  res.end(JSON.stringify(seen));
};
const listen = (srv, port, ip) => new Promise((r) => srv.listen(port, ip, r));
await Promise.all([
  ...[${JSON.stringify(ECHO_IP)}, ${JSON.stringify(CHOSEN_IP)}].flatMap((ip) => [
    listen(https.createServer(tls("echo"), handler("https " + ip)), 443, ip),
    listen(http.createServer(handler("http " + ip)), 80, ip),
  ]),
  listen(https.createServer(tls("other"), handler("wrong-name")), 443, ${JSON.stringify(WRONG_IP)}),
]);
console.log("listening");
`;
  writeFileSync(`${dir}/echo.mjs`, src);
  return new Promise((resolve, reject) => {
    const argv = ["ip", "netns", "exec", NS, process.execPath, `${dir}/echo.mjs`];
    const p = spawn(argv[0], argv.slice(1), { stdio: ["ignore", "pipe", "pipe"] });
    let err = "";
    p.stderr.on("data", (d) => (err += d));
    p.stdout.on("data", (d) => (upstreamLog += d));
    p.stdout.once("data", () => resolve(p));
    p.once("exit", (code) => reject(new Error(`echo server exited (${code}): ${err}`)));
  });
}

function world() {
  sh("ip", ["netns", "add", NS]);
  sh("ip", ["link", "add", HOST_IF, "type", "veth", "peer", "name", PEER_IF]);
  sh("ip", ["link", "set", PEER_IF, "netns", NS]);
  sh("ip", ["addr", "add", `${HOST_IP}/25`, "dev", HOST_IF]);
  sh("ip", ["link", "set", HOST_IF, "up"]);
  sh("ip", ["-n", NS, "addr", "add", `${ECHO_IP}/25`, "dev", PEER_IF]);
  sh("ip", ["-n", NS, "addr", "add", `${CHOSEN_IP}/25`, "dev", PEER_IF]);
  sh("ip", ["-n", NS, "addr", "add", `${WRONG_IP}/25`, "dev", PEER_IF]);
  sh("ip", ["-n", NS, "link", "set", PEER_IF, "up"]);
  sh("ip", ["-n", NS, "link", "set", "lo", "up"]);
  sh("ip", ["-n", NS, "route", "add", "default", "via", HOST_IP]);
}

function unworld() {
  try { sh("ip", ["link", "del", HOST_IF]); } catch {}
  try { sh("ip", ["netns", "del", NS]); } catch {}
}

before(async () => {
  assert.ok(BIN || EXTERNAL, "AIRLOCK_BIN must name the airlock binary (make sdk-test sets it)");
  dir = mkdtempSync(path.join(os.tmpdir(), "airlock-vault-"));
  unworld();
  world();
  makeCerts();
  echo = await startEcho();
  if (EXTERNAL) {
    ({ domain, apiKey } = EXTERNAL);
  } else {
    resolver = await fakeResolver({ "echo.test": [203, 0, 113, 180], "plain.test": [203, 0, 113, 180] });
    domain = `127.0.0.1:${await freePort()}`;
    cfgPath = path.join(dir, "airlock.yaml");
    const lines = [
      `listen: ${domain}`,
      `stateDir: ${dir}/state`,
      "gateway:",
      `  listen: 127.0.0.1:${await freePort()}`,
      "egress:",
      `  mode: ${MODE}`,
      `  upstreams: [127.0.0.1:${resolver.address().port}]`,
      ...HOST_STATE.lines,
      `  upstreamCAFile: ${dir}/ca.crt`,
    ];
    lines.push(...dockerSection(PREFIX));
    writeFileSync(cfgPath, lines.join("\n") + "\n");
    ({ proc: server, apiKey, log: serverLog } = await startServer(BIN, cfgPath));
  }
  sbx = await Sandbox.create({
    connectionConfig: config(),
    image: IMAGE,
    resource: EXTERNAL?.resource,
    metadata: { suite: RUN },
    networkPolicy: {
      defaultAction: "deny",
      egress: [{ action: "allow", target: ECHO }, { action: "allow", target: PLAIN }],
    },
    credentialProxy: { enabled: true },
    timeoutSeconds: 900,
    readyTimeoutSeconds: 60,
  });
});

after(async () => {
  if (sbx) await sbx.kill().catch(() => {});
  if (sbxOpen) await sbxOpen.kill().catch(() => {});
  if (server) await stopServer(server);
  if (!EXTERNAL) removeContainers(PREFIX); // held warm-pool members and anything left
  if (echo) echo.kill();
  if (resolver) resolver.close();
  unworld();
  cleanHostState(BIN, HOST_STATE);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

// seen runs curl in the sandbox (default sbx) and returns what the echo server saw.
async function seen(args, box = sbx) {
  const ex = await box.commands.run(`curl -sS --max-time 10 ${args}`);
  assert.equal(ex.error, undefined, `curl ${args}: ${JSON.stringify(ex.error)} ${ex.logs.stderr.map((m) => m.text).join("\n")}`);
  return JSON.parse(ex.logs.stdout.map((m) => m.text).join(""));
}

async function issuer(host) {
  const ex = await sbx.commands.run(
    `echo | openssl s_client -connect ${host}:443 -servername ${host} 2>/dev/null | openssl x509 -noout -issuer`);
  return ex.logs.stdout.map((m) => m.text).join("");
}

// serverText is the server's log so far: the suite's `airlock up`'s, or the external
// installation's from its control interface.
async function serverText() {
  return EXTERNAL ? control("GET", "/log") : serverLog();
}

// restartServer restarts the server, with vault.plainHTTP set to plainHTTP when given
// (the suite's `airlock up` with its config file so amended, or the external
// installation through its control interface), and reconnects sbx.
async function restartServer(plainHTTP) {
  if (EXTERNAL) {
    await control("POST", plainHTTP ? `/reconfigure?vaultPlainHTTP=${plainHTTP}` : "/restart");
  } else {
    await stopServer(server);
    if (plainHTTP) writeFileSync(cfgPath, readFileSync(cfgPath, "utf8") + `vault:\n  plainHTTP: ${plainHTTP}\n`);
    ({ proc: server, apiKey, log: serverLog } = await startServer(BIN, cfgPath));
  }
  sbx = await Sandbox.connect({ sandboxId: sbx.id, connectionConfig: config() });
}

function keep(state) {
  responses.push(JSON.stringify(state));
  return state;
}

test(`[${MODE}] the sandbox runs on the ${MODE} datapath`, ownServerOrControl("reads the backend from the server's log"), async () => {
  assert.match(await serverText(), new RegExp(`backend=${MODE}`), "egressd reports the backend under test");
});

test("a binding outside the networkPolicy is refused and nothing is created", async () => {
  await assert.rejects(
    sbx.credentialVault.create({
      credentials: [{ name: "gh", source: { type: "inline", value: SECRET } }],
      bindings: [{ name: "elsewhere", match: { hosts: ["other.test"] }, auth: { type: "bearer", credential: "gh" } }],
    }),
    (err) => err instanceof SandboxException && err.statusCode === 412,
  );
  await assert.rejects(sbx.credentialVault.get(), (err) => err instanceof SandboxException && err.statusCode === 404);
});

test("create: a bearer binding is injected for its method and path only", async () => {
  const st = keep(await sbx.credentialVault.create({
    credentials: [{ name: "gh", source: { type: "inline", value: SECRET } }],
    bindings: [{
      name: "gh-api",
      match: { hosts: [ECHO], methods: ["GET"], paths: ["/v1/*"] },
      auth: { type: "bearer", credential: "gh" },
    }],
  }));
  assert.equal(st.revision, 1);
  assert.deepEqual(st.credentials.map((c) => [c.name, c.sourceType]), [["gh", "inline"]]);
  assert.deepEqual(st.bindings.map((b) => [b.name, b.auth.type]), [["gh-api", "bearer"]]);

  const got = await seen(`https://${ECHO}/v1/repos`);
  assert.equal(got.headers.authorization, `Bearer ${SECRET}`);
  assert.equal(got.path, "/v1/repos");
  const guessed = await seen(`-H 'Authorization: Bearer guess' https://${ECHO}/v1/x`);
  assert.equal(guessed.headers.authorization, `Bearer ${SECRET}`, "the binding's value replaces the sandbox's own");
  assert.equal((await seen(`-X POST https://${ECHO}/v1/repos`)).headers.authorization, undefined, "method not bound");
  assert.equal((await seen(`https://${ECHO}/other`)).headers.authorization, undefined, "path not bound");
  assert.equal((await seen(`-k https://${PLAIN}/v1/repos`)).headers.authorization, undefined, "host not bound");
  assert.match(await issuer(ECHO), /Airlock credential proxy CA/, `${ECHO} is intercepted`);
  assert.match(await issuer(PLAIN), /airlock-sdk-test-ca/, `${PLAIN} is spliced, not intercepted`);
});

test("read: sanitized state, credentials and bindings", async () => {
  const st = keep(await sbx.credentialVault.get());
  assert.equal(st.revision, 1);
  const creds = await sbx.credentialVault.listCredentials();
  responses.push(JSON.stringify(creds));
  assert.deepEqual(creds.map((c) => c.name), ["gh"]);
  const b = await sbx.credentialVault.getBinding("gh-api");
  responses.push(JSON.stringify(b));
  assert.deepEqual(b.match.methods, ["GET"]);
  assert.deepEqual(b.match.schemes, ["https"]);
  assert.deepEqual(b.match.ports, [443]);
  await assert.rejects(sbx.credentialVault.getBinding("nope"), (err) => err.statusCode === 404);
});

test("patch: add, replace and delete bindings atomically", async () => {
  let st = keep(await sbx.credentialVault.patch({
    expectedRevision: 1,
    credentials: { add: [{ name: "svc", source: { type: "inline", value: SECRET2 } }] },
    bindings: {
      add: [{ name: "svc-key", match: { hosts: [ECHO], paths: ["/v2/*"] }, auth: { type: "apiKey", name: "X-Api-Key", credential: "svc" } }],
      replace: [{ name: "gh-api", match: { hosts: [ECHO], methods: ["GET", "POST"], paths: ["/v1/*"] }, auth: { type: "bearer", credential: "gh" } }],
    },
  }));
  assert.equal(st.revision, 2);
  assert.equal((await seen(`-X POST https://${ECHO}/v1/repos`)).headers.authorization, `Bearer ${SECRET}`, "replaced binding covers POST");
  const v2 = await seen(`-X PUT https://${ECHO}/v2/items`);
  assert.equal(v2.headers["x-api-key"], SECRET2);
  assert.equal(v2.headers.authorization, undefined);

  await assert.rejects(sbx.credentialVault.patch({ expectedRevision: 1, bindings: { delete: ["gh-api"] } }),
    (err) => err.statusCode === 409, "a stale revision is refused");
  st = keep(await sbx.credentialVault.patch({ expectedRevision: 2, bindings: { delete: ["gh-api"] } }));
  assert.equal(st.revision, 3);
  assert.deepEqual(st.bindings.map((b) => b.name), ["svc-key"]);
  assert.equal((await seen(`https://${ECHO}/v1/repos`)).headers.authorization, undefined, "deleted binding injects nothing");
});

test("the vault survives a restart of airlock up and keeps injecting", ownServerOrControl("restarts the server"), async () => {
  await restartServer();
  assert.equal(keep(await sbx.credentialVault.get()).revision, 3);
  let got;
  let failed;
  for (let i = 0; i < 50; i++) { // egressd re-adopts the sandbox right after start
    got = await seen(`https://${ECHO}/v2/after-restart`).catch((err) => void (failed = err));
    if (got) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  if (!got) {
    const recs = JSON.stringify((await auditRecords(domain, apiKey, sbx.id)).slice(-4));
    assert.fail(`no answer after the restart: ${failed?.message}\n--- last audit records: ${recs}\n--- the server's log:\n${await serverText()}`);
  }
  assert.equal(got.headers["x-api-key"], SECRET2);
  // An external installation's state may hold other sandboxes' vaults: this one's is
  // <sandbox id>.vault (egressd/vault's store).
  const sealed = files(EXTERNAL ? EXTERNAL.stateDir : `${dir}/state`)
    .filter((f) => f.endsWith(".vault") && (!EXTERNAL || path.basename(f) === `${sbx.id}.vault`));
  assert.equal(sealed.length, 1, `one sealed vault file: ${sealed}`);
  const raw = readFileSync(sealed[0]).toString("latin1");
  for (const secret of [SECRET, SECRET2]) assert.ok(!raw.includes(secret), "the sealed store holds ciphertext");
});

test("delete: nothing is injected afterwards", async () => {
  await sbx.credentialVault.delete();
  await assert.rejects(sbx.credentialVault.get(), (err) => err.statusCode === 404);
  const got = await seen(`-k https://${ECHO}/v2/items`);
  assert.equal(got.headers["x-api-key"], undefined);
});

// run runs cmd in box and fails the test when it fails.
async function run(box, cmd) {
  const ex = await box.commands.run(cmd);
  assert.equal(ex.error, undefined, `${cmd}: ${JSON.stringify(ex.error)} ${ex.logs.stderr.map((m) => m.text).join("\n")}`);
}

// status runs curl in box and returns the HTTP status ("000" when none came).
async function status(args, box = sbx) {
  const ex = await box.commands.run(`curl -s -o /dev/null -w '%{http_code}' --max-time 10 ${args}`);
  return ex.logs.stdout.map((m) => m.text).join("").trim();
}

// CHOOSE are the two ways a sandbox picks the address of a name itself: each calls fn
// with the curl options that make `name` (at `port`) mean `ip`.
const CHOOSE = {
  "--resolve": async (box, name, ip, port, fn) => fn(`--resolve ${name}:${port}:${ip}`),
  "/etc/hosts": async (box, name, ip, port, fn) => {
    await run(box, `cp /etc/hosts /tmp/hosts.orig && echo '${ip} ${name}' >> /etc/hosts`);
    try {
      return await fn("");
    } finally {
      await run(box, "cat /tmp/hosts.orig > /etc/hosts");
    }
  },
};

// Bindings of echo.test for HTTPS (443) and plain HTTP (80) under /v3/.
const CHOSEN_VAULT = {
  credentials: [{ name: "gh", source: { type: "inline", value: SECRET } }],
  bindings: [
    { name: "echo-https", match: { hosts: [ECHO], paths: ["/v3/*"] }, auth: { type: "bearer", credential: "gh" } },
    { name: "echo-http", match: { hosts: [ECHO], schemes: ["http"], ports: [80], paths: ["/v3/*"] }, auth: { type: "bearer", credential: "gh" } },
  ],
};

// upstreamSaw is every request line of upstreamLog from server.
function upstreamSaw(server) {
  return upstreamLog.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l)).filter((r) => r.server === server);
}

test("HTTPS to a bound host at an address the sandbox chose gets the credential", async () => {
  keep(await sbx.credentialVault.create(CHOSEN_VAULT));
  for (const [how, choose] of Object.entries(CHOOSE)) {
    const got = await choose(sbx, ECHO, CHOSEN_IP, 443, (opt) => seen(`${opt} https://${ECHO}/v3/x`));
    assert.equal(got.server, `https ${CHOSEN_IP}`, `${how}: the address the sandbox chose is the one dialled`);
    assert.equal(got.headers.authorization, `Bearer ${SECRET}`, `${how}: the certificate proves ${ECHO}, so the credential goes`);
  }
});

test("a server that cannot prove the bound name never sees the secret", async () => {
  for (const [how, choose] of Object.entries(CHOOSE)) {
    const code = await choose(sbx, ECHO, WRONG_IP, 443, (opt) => status(`${opt} https://${ECHO}/v3/x`));
    assert.match(code, /^5\d\d$/, `${how}: an upstream with a certificate for other.test only`);
  }
  assert.deepEqual(upstreamSaw("wrong-name"), [], "the wrong-name server got no request, so no secret");
});

test("plain HTTP: a learned address gets the credential, one the sandbox chose does not (vault.plainHTTP: learned)", async () => {
  const got = await seen(`http://${ECHO}/v3/x`);
  assert.equal(got.server, `http ${ECHO_IP}`);
  assert.equal(got.headers.authorization, `Bearer ${SECRET}`, `the address a DNS answer gave for ${ECHO}`);
  for (const [how, choose] of Object.entries(CHOOSE)) {
    // Under this default-deny policy an address nobody learned is not reachable at all.
    const code = await choose(sbx, ECHO, CHOSEN_IP, 80, (opt) => status(`${opt} http://${ECHO}/v3/x`));
    assert.equal(code, "403", `${how}: the policy does not allow ${CHOSEN_IP}`);
  }
  assert.deepEqual(upstreamSaw(`http ${CHOSEN_IP}`).filter((r) => JSON.stringify(r).includes(SECRET)), []);
});

test("a default-allow sandbox: unbound requests follow the policy, plain HTTP to a chosen address goes without the credential", async () => {
  sbxOpen = await Sandbox.create({
    connectionConfig: config(),
    image: IMAGE,
    resource: EXTERNAL?.resource,
    metadata: { suite: RUN },
    networkPolicy: { defaultAction: "allow", egress: [{ action: "allow", target: ECHO }] },
    credentialProxy: { enabled: true },
    timeoutSeconds: 900,
    readyTimeoutSeconds: 60,
  });
  keep(await sbxOpen.credentialVault.create(CHOSEN_VAULT));
  for (const [how, choose] of Object.entries(CHOOSE)) {
    let got = await choose(sbxOpen, "unbound.test", CHOSEN_IP, 80, (opt) => seen(`${opt} http://unbound.test/v3/x`, sbxOpen));
    assert.equal(got.server, `http ${CHOSEN_IP}`, `${how}: plain HTTP that no binding matches`);
    got = await choose(sbxOpen, "unbound.test", CHOSEN_IP, 443, (opt) => seen(`-k ${opt} https://unbound.test/v3/x`, sbxOpen));
    assert.equal(got.server, `https ${CHOSEN_IP}`, `${how}: HTTPS that no binding matches`);
    got = await choose(sbxOpen, ECHO, CHOSEN_IP, 80, (opt) => seen(`${opt} http://${ECHO}/v3/x`, sbxOpen));
    assert.equal(got.server, `http ${CHOSEN_IP}`, `${how}: plain HTTP to a bound host at a chosen address is forwarded`);
    assert.equal(got.headers.authorization, undefined, `${how}: ... without the credential`);
    got = await choose(sbxOpen, ECHO, CHOSEN_IP, 443, (opt) => seen(`${opt} https://${ECHO}/v3/x`, sbxOpen));
    assert.equal(got.headers.authorization, `Bearer ${SECRET}`, `${how}: HTTPS to a bound host at a chosen address`);
  }
  assert.equal((await seen(`http://${CHOSEN_IP}/x`, sbxOpen)).server, `http ${CHOSEN_IP}`, "an address literal (Host is the address)");
  assert.equal((await seen(`-k https://${CHOSEN_IP}/x`, sbxOpen)).server, `https ${CHOSEN_IP}`, "TLS without SNI");
  const other = await seen(`-k --resolve other.test:443:${WRONG_IP} https://other.test/x`, sbxOpen);
  assert.equal(other.server, "wrong-name", "the wrong-name server answers whoever reaches it (so its 5xx above is the proxy's refusal)");
  const records = await auditRecords(domain, apiKey, sbxOpen.id);
  const body = JSON.stringify(records);
  const notInjected = records.filter((r) => r.source === "credential" && r.rule === "echo-http" && r.action === "deny" &&
    r.reason.includes("not injected: address not learned"));
  assert.equal(notInjected.length, 2, `each plain-HTTP request to the chosen address is audited as not injected: ${body.slice(0, 2000)}`);
});

test("vault.plainHTTP: policy: plain HTTP to an address the sandbox chose gets the credential", ownServerOrControl("restarts the server with vault.plainHTTP: policy"), async () => {
  await restartServer("policy");
  for (let i = 0; i < 50 && (await status(`--resolve ${ECHO}:80:${CHOSEN_IP} http://${ECHO}/v3/x`)) !== "200"; i++) {
    await new Promise((r) => setTimeout(r, 200)); // egressd re-adopts the sandbox right after start
  }
  for (const [how, choose] of Object.entries(CHOOSE)) {
    const got = await choose(sbx, ECHO, CHOSEN_IP, 80, (opt) => seen(`${opt} http://${ECHO}/v3/x`));
    assert.equal(got.server, `http ${CHOSEN_IP}`, how);
    assert.equal(got.headers.authorization, `Bearer ${SECRET}`, `${how}: the operator opted in`);
  }
  // Still only where the policy accepts the address for the name: not a private one.
  const code = await status(`--resolve ${ECHO}:80:10.255.255.1 http://${ECHO}/v3/x`);
  assert.equal(code, "403", "a private address, which only an explicit rule allows");
});

// files lists every regular file under root.
function files(root) {
  const out = [];
  for (const e of readdirSync(root, { withFileTypes: true })) {
    const p = path.join(root, e.name);
    if (e.isDirectory()) out.push(...files(p));
    else if (e.isFile()) out.push(p);
  }
  return out;
}

test("no secret value outside the sealed store", async () => {
  const metrics = await (await fetch(`http://${domain}/metrics`, { headers: { "OPEN-SANDBOX-API-KEY": apiKey } })).text();
  const log = EXTERNAL?.control ? await serverText() : serverLog();
  const places = { "server log": log, "vault API responses": responses.join("\n"), metrics };
  for (const f of files(EXTERNAL ? EXTERNAL.stateDir : `${dir}/state`)) {
    places[f] = readFileSync(f).toString("latin1");
  }
  for (const [where, text] of Object.entries(places)) {
    for (const secret of [SECRET, SECRET2]) {
      assert.ok(!text.includes(secret), `a secret value is in ${where}`);
    }
  }
  assert.ok(Object.keys(places).some((p) => p.includes(`${path.sep}audit${path.sep}`)), "the audit log was searched");
  const records = await auditRecords(domain, apiKey, sbx.id);
  const injected = records.filter((r) => r.source === "credential" && r.rule === "gh-api" && r.action === "allow");
  assert.ok(injected.length >= 3, `injections of gh-api are audited: ${injected.length}`);
  assert.ok(records.some((r) => r.source === "credential" && r.action === "deny"), "requests without a matching binding are audited");
});
