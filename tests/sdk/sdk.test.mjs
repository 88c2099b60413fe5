// The published OpenSandbox JavaScript SDK (@alibaba-group/opensandbox, pinned in
// package-lock.json) driving a real `airlock up` on this host. The test starts the
// server itself ($AIRLOCK_BIN up) on a free port with a temporary state directory and
// stops it at the end; when the server cannot start, the suite fails. In the harness's
// external-server mode (AIRLOCK_SDK_LIFECYCLE: see harness.mjs) it runs against an
// installation already up instead, Airlock on the one-node Kubernetes cluster
// (internal/kubenode TestSDKSuitesOnNode): the fake names are the cluster DNS's, the pool
// test claims from the installation's pool, and pause/resume goes through a snapshot
// of the pod on its node.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import {
  ConnectionConfig,
  Sandbox,
  SandboxException,
  SandboxManager,
} from "@alibaba-group/opensandbox";
import {
  dockerSection,
  EXTERNAL,
  fakeName,
  fakeResolver,
  freePort,
  killSuite,
  removeContainers,
  cleanHostState,
  egressHostState,
  startServer,
  stopServer,
} from "./harness.mjs";

const BIN = process.env.AIRLOCK_BIN;
const HOST_STATE = egressHostState("sdk");
const IMAGE = process.env.AIRLOCK_TEST_IMAGE ?? "airlock/sandbox:latest";
const RUN = `sdk${process.pid}`;
const PREFIX = `altest-sdk-sdk${process.pid}-`;
// The fake internet's names as sandboxes resolve them (the same addresses either way).
const ALLOWED = fakeName("allowed.test");
const DENIED = fakeName("denied.test");
// Every create's resource limits: the SDK's default unless the installation is small.
const RESOURCE = EXTERNAL?.resource;
// The warm pool the claim test uses: the suite's own server's, or the installation's.
const POOL = EXTERNAL
  ? EXTERNAL.pool
  : { name: "sdk", size: 2, image: IMAGE, resource: undefined, domain: undefined };

let server;
let stateDir;
let domain;
let gateway;
let apiKey;
let resolver;

function config(extra = {}) {
  return new ConnectionConfig({ domain, apiKey, requestTimeoutSeconds: 60, ...extra });
}

before(async () => {
  if (EXTERNAL) {
    ({ domain, gateway, apiKey } = EXTERNAL);
    return;
  }
  assert.ok(BIN, "AIRLOCK_BIN must name the airlock binary (make sdk-test sets it)");
  stateDir = mkdtempSync(path.join(os.tmpdir(), "airlock-sdk-"));
  const port = await freePort();
  domain = `127.0.0.1:${port}`;
  gateway = `127.0.0.1:${await freePort()}`;
  resolver = await fakeResolver({ "allowed.test": [203, 0, 113, 10], "denied.test": [203, 0, 113, 20] });
  const cfg = path.join(stateDir, "airlock.yaml");
  const lines = [
    `listen: ${domain}`,
    `stateDir: ${path.join(stateDir, "state")}`,
    "gateway:",
    `  listen: ${gateway}`,
    "egress:",
    `  upstreams: [127.0.0.1:${resolver.address().port}]`,
    ...HOST_STATE.lines,
    // A warm pool for the SDK's default resources: creates that find a ready member are
    // claimed from it, the others are served cold; the suite passes either way.
    "pools:",
    "  - name: sdk",
    `    image: ${IMAGE}`,
    "    size: 2",
    '    resourceLimits: {cpu: "1", memory: 2Gi}',
  ];
  lines.push(...dockerSection(PREFIX));
  writeFileSync(cfg, lines.join("\n") + "\n");
  ({ proc: server, apiKey } = await startServer(BIN, cfg));
});

after(async () => {
  if (EXTERNAL) {
    await killSuite(config(), RUN);
    return;
  }
  if (server && server.exitCode === null) {
    await killSuite(config(), RUN);
    await stopServer(server);
  }
  removeContainers(PREFIX); // held warm-pool members and anything left
  if (stateDir) rmSync(stateDir, { recursive: true, force: true });
  cleanHostState(BIN, HOST_STATE);
  if (resolver) resolver.close();
});

let sbx;

test("create with metadata and env, then getInfo", async () => {
  sbx = await Sandbox.create({
    connectionConfig: config(),
    image: IMAGE,
    resource: RESOURCE,
    metadata: { suite: RUN, role: "main" },
    env: { GREETING: "hello-from-env" },
    timeoutSeconds: 600,
    readyTimeoutSeconds: 60,
  });
  const info = await sbx.getInfo();
  assert.equal(info.id, sbx.id);
  assert.equal(info.status.state, "Running");
  assert.equal(info.metadata.suite, RUN);
  assert.equal(info.metadata.role, "main");
  assert.deepEqual(info.entrypoint, ["tail", "-f", "/dev/null"]);
  assert.ok(info.expiresAt instanceof Date && info.expiresAt > new Date(), "expiresAt is in the future");
});

test("endpoints point through the gateway", async () => {
  const ep = await sbx.getEndpoint(44772);
  assert.equal(ep.endpoint, `${gateway}/sandboxes/${sbx.id}/proxy/44772`);
  const egress = await sbx.getEndpoint(18080);
  assert.equal(egress.endpoint, `${gateway}/sandboxes/${sbx.id}/proxy/18080`);
  // execd and the egress API are never public: their endpoints carry the sandbox's access
  // token, which the SDK sends with every call; without it the gateway answers 401.
  for (const e of [ep, egress]) {
    assert.match(e.headers?.["OpenSandbox-Secure-Access"] ?? "", /^[0-9a-f]{64}$/, JSON.stringify(e));
  }
  const url = `http://${ep.endpoint}/ping`;
  const denied = await fetch(url);
  assert.equal(denied.status, 401);
  assert.equal((await denied.json()).code, "UNAUTHORIZED");
  assert.equal((await fetch(url, { headers: ep.headers })).status, 200);
  const app = await sbx.getEndpoint(8000);
  assert.deepEqual(app.headers ?? {}, {}, "an application port is public by default");
});

test("foreground command sees the sandbox env", async () => {
  const ex = await sbx.commands.run("echo $GREETING; echo line2");
  assert.equal(ex.error, undefined, JSON.stringify(ex.error));
  assert.deepEqual(ex.logs.stdout.map((m) => m.text), ["hello-from-env", "line2"]);
});

test("the sandbox runs under the configured OCI runtime", async () => {
  // gVisor's kernel announces itself in dmesg (runc sandboxes cannot read the host's).
  const ex = await sbx.commands.run("dmesg 2>/dev/null | head -1; true");
  const banner = ex.logs.stdout.map((m) => m.text).join("");
  if (process.env.AIRLOCK_DOCKER_RUNTIME === "runsc") assert.match(banner, /gVisor/);
  else assert.doesNotMatch(banner, /gVisor/);
});

test("failing command reports its exit code", async () => {
  const ex = await sbx.commands.run("echo before; exit 3");
  assert.ok(ex.error, "a failing command has an error");
  assert.equal(ex.error.value ?? ex.error.evalue, "3");
  assert.deepEqual(ex.logs.stdout.map((m) => m.text), ["before"]);
});

test("background command with status and logs", async () => {
  const ex = await sbx.commands.run("echo bg-out; sleep 1; echo bg-done", { background: true });
  assert.ok(ex.id, "background run returns a command id");
  let status;
  for (let i = 0; i < 100; i++) {
    status = await sbx.commands.getCommandStatus(ex.id);
    if (!status.running) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  assert.equal(status.running, false);
  assert.equal(status.exitCode, 0);
  const logs = await sbx.commands.getBackgroundCommandLogs(ex.id);
  assert.match(logs.content, /bg-out\n[\s\S]*bg-done/);
});

test("bash session keeps cwd and exported variables", async () => {
  const sid = await sbx.commands.createSession();
  await sbx.commands.runInSession(sid, "cd /tmp && export SESSION_VAR=42");
  const ex = await sbx.commands.runInSession(sid, 'echo "$SESSION_VAR $(pwd)"');
  assert.deepEqual(ex.logs.stdout.map((m) => m.text), ["42 /tmp"]);
  await sbx.commands.deleteSession(sid);
});

test("files: write, read, search", async () => {
  await sbx.files.writeFiles([
    { path: "/tmp/sdkfiles/hello.txt", data: "Hello Airlock", mode: 644 },
    { path: "/tmp/sdkfiles/other.log", data: "x" },
  ]);
  assert.equal(await sbx.files.readFile("/tmp/sdkfiles/hello.txt"), "Hello Airlock");
  const found = await sbx.files.search({ path: "/tmp/sdkfiles", pattern: "*.txt" });
  assert.deepEqual(found.map((f) => f.path), ["/tmp/sdkfiles/hello.txt"]);
});

test("list with state and metadata filters", async () => {
  const mgr = SandboxManager.create({ connectionConfig: config() });
  const hit = await mgr.listSandboxInfos({ states: ["running", "Paused"], metadata: { suite: RUN, role: "main" } });
  assert.deepEqual(hit.items.map((s) => s.id), [sbx.id]);
  const miss = await mgr.listSandboxInfos({ metadata: { suite: RUN, role: "other" } });
  assert.equal(miss.items.length, 0);
  const paused = await mgr.listSandboxInfos({ states: ["Paused"], metadata: { suite: RUN } });
  assert.equal(paused.items.length, 0);
});

test("metadata merge patch", async () => {
  const info = await sbx.patchMetadata({ extra: "1", role: null });
  assert.equal(info.metadata.extra, "1");
  assert.equal(info.metadata.role, undefined);
  assert.equal(info.metadata.suite, RUN);
});

// On Kubernetes (external-server mode on the node, lifecycle --snapshots) pause goes
// through a snapshot: the pod is deleted and made again from it under the same id.
test("pause, then resume", async () => {
  await sbx.pause();
  assert.equal((await sbx.getInfo()).status.state, "Paused");
  sbx = await sbx.resume({ readyTimeoutSeconds: 60 });
  assert.equal((await sbx.getInfo()).status.state, "Running");
  const ex = await sbx.commands.run("echo after-resume");
  assert.deepEqual(ex.logs.stdout.map((m) => m.text), ["after-resume"]);
});

test("renew moves the expiry", async () => {
  const before = (await sbx.getInfo()).expiresAt;
  const res = await sbx.renew(1800);
  const after = new Date(res.expiresAt);
  assert.ok(after > before, `${after.toISOString()} > ${before.toISOString()}`);
  assert.equal((await sbx.getInfo()).expiresAt.getTime(), after.getTime());
});

test("kill removes the sandbox", async () => {
  await sbx.kill();
  await assert.rejects(sbx.getInfo(), (err) => err instanceof SandboxException && err.statusCode === 404);
  await sbx.close();
});

test("networkPolicy at create is enforced; the egress API changes it at runtime", async () => {
  const pol = await Sandbox.create({
    connectionConfig: config(),
    image: IMAGE,
    resource: RESOURCE,
    metadata: { suite: RUN, role: "egress" },
    networkPolicy: { defaultAction: "deny", egress: [{ action: "allow", target: ALLOWED }] },
    timeoutSeconds: 600,
    readyTimeoutSeconds: 60,
  });
  try {
    const resolve = async (name) =>
      (await pol.commands.run(`getent hosts ${name} | cut -d' ' -f1`)).logs.stdout.map((m) => m.text).join("");
    assert.equal(await resolve(ALLOWED), "203.0.113.10");
    assert.equal(await resolve(DENIED), "", "a name the policy denies does not resolve");

    const before = await pol.getEgressPolicy();
    assert.equal(before.defaultAction, "deny");
    assert.deepEqual(before.egress.map((r) => r.target), [ALLOWED]);

    await pol.patchEgressRules([{ action: "allow", target: DENIED }]);
    const patched = await pol.getEgressPolicy();
    assert.deepEqual(patched.egress.map((r) => r.target), [DENIED, ALLOWED]);
    let got = "";
    for (let i = 0; i < 50 && got === ""; i++) {
      got = await resolve(DENIED); // egressd applies the new version within ms
    }
    assert.equal(got, "203.0.113.20", "the patched rule is enforced");

    await pol.deleteEgressRules([ALLOWED]);
    const after = await pol.getEgressPolicy();
    assert.deepEqual(after.egress.map((r) => r.target), [DENIED]);
    assert.equal(await resolve(ALLOWED), "", "a removed rule no longer resolves");
  } finally {
    await pol.kill();
    await pol.close();
  }
});

async function poolMetric(name) {
  const res = await fetch(`http://${POOL.domain ?? domain}/metrics`, { headers: { "OPEN-SANDBOX-API-KEY": apiKey } });
  const line = (await res.text()).split("\n").find((l) => l.startsWith(name));
  return line ? Number(line.split(" ").pop()) : 0;
}

test("a create claimed from the warm pool is a sandbox like any other", POOL ? {} : { skip: "AIRLOCK_SDK_POOL names no pool" }, async () => {
  const ready = `airlock_lifecycle_pool_members{pool="${POOL.name}",state="ready"}`;
  for (let i = 0; i < 1200 && (await poolMetric(ready)) < POOL.size; i++) {
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(await poolMetric(ready), POOL.size, "the pool filled");
  const claims = `airlock_lifecycle_pool_claims_total{pool="${POOL.name}"}`;
  const before = await poolMetric(claims);
  const started = Date.now();
  // The replica holding the pool serves the claim (on Kubernetes the Lease holder;
  // another replica would create cold).
  const connectionConfig = POOL.domain ? config({ domain: POOL.domain }) : config();
  const warm = await Sandbox.create({
    connectionConfig,
    image: POOL.image,
    resource: POOL.resource,
    metadata: { suite: RUN, role: "pooled" },
    env: { POOLED: "claimed-env" },
    entrypoint: ["sh", "-c", "echo started:$POOLED > /tmp/entry; exec tail -f /dev/null"],
    networkPolicy: { defaultAction: "deny", egress: [{ action: "allow", target: ALLOWED }] },
    timeoutSeconds: 600,
    readyTimeoutSeconds: 60,
  });
  const tookMs = Date.now() - started;
  try {
    assert.equal(await poolMetric(claims), before + 1, "the create was claimed from the pool");
    const info = await warm.getInfo();
    assert.equal(info.status.state, "Running");
    assert.equal(info.image?.uri ?? POOL.image, POOL.image);
    assert.deepEqual(info.entrypoint, ["sh", "-c", "echo started:$POOLED > /tmp/entry; exec tail -f /dev/null"]);
    const out = async (cmd) => (await warm.commands.run(cmd)).logs.stdout.map((m) => m.text).join("");
    assert.equal(await out("echo $POOLED"), "claimed-env");
    assert.equal(await out(`getent hosts ${DENIED} | cut -d' ' -f1`), "", "the policy is enforced from the first command");
    assert.equal(await out(`getent hosts ${ALLOWED} | cut -d' ' -f1`), "203.0.113.10");
    let entry = "";
    for (let i = 0; i < 50 && entry === ""; i++) entry = await out("cat /tmp/entry 2>/dev/null");
    assert.equal(entry, "started:claimed-env", "the entrypoint ran with the request's env");
    console.log(`# pooled Sandbox.create (policy, env, entrypoint) to ready: ${tookMs} ms`);
  } finally {
    await warm.kill();
    await warm.close();
  }
});

test("connect to a missing id fails with the request id echoed", async () => {
  const rid = `sdk-test-${RUN}`;
  await assert.rejects(
    Sandbox.connect({ sandboxId: "nosuchsandbox", connectionConfig: config({ headers: { "X-Request-ID": rid } }) }),
    (err) => {
      assert.ok(err instanceof SandboxException, String(err));
      assert.equal(err.statusCode, 404);
      assert.equal(err.error.code, "SANDBOX_NOT_FOUND");
      assert.equal(err.requestId, rid);
      return true;
    },
  );
});
