// The published OpenSandbox JavaScript SDK, unchanged, with a `user` key made through
// Airlock's key API (/v1/keys) on a real `airlock up`: the user creates a sandbox and
// runs a command in it; another user's key sees none of it (404, empty list); the
// first admin (the key airlock up printed) sees it, created by the user. In the
// harness's external-server mode (AIRLOCK_SDK_LIFECYCLE: see harness.mjs) it runs against
// an installation already up, whose key is the first admin's (on Kubernetes the keys
// live in the cluster store, shared by the lifecycle replicas).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { ConnectionConfig, Sandbox, SandboxManager } from "@alibaba-group/opensandbox";
import {
  dockerSection,
  EXTERNAL,
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
const HOST_STATE = egressHostState("keys");
const IMAGE = process.env.AIRLOCK_TEST_IMAGE ?? "airlock/sandbox:latest";
const RUN = `keys${process.pid}`;
const PREFIX = `altest-sdk-keys${process.pid}-`;

let server, stateDir, domain, gateway, adminKey, resolver;

const config = (apiKey) => new ConnectionConfig({ domain, apiKey, requestTimeoutSeconds: 60 });

async function newKey(name, role) {
  const r = await fetch(`http://${domain}/v1/keys`, {
    method: "POST",
    headers: { "OPEN-SANDBOX-API-KEY": adminKey, "Content-Type": "application/json" },
    body: JSON.stringify({ name, role }),
  });
  assert.equal(r.status, 201, await r.clone().text());
  return r.json();
}

before(async () => {
  if (EXTERNAL) {
    ({ domain, gateway, apiKey: adminKey } = EXTERNAL);
    return;
  }
  assert.ok(BIN, "AIRLOCK_BIN must name the airlock binary (make sdk-test sets it)");
  stateDir = mkdtempSync(path.join(os.tmpdir(), "airlock-sdk-keys-"));
  domain = `127.0.0.1:${await freePort()}`;
  resolver = await fakeResolver({});
  const cfg = path.join(stateDir, "airlock.yaml");
  const lines = [
    `listen: ${domain}`,
    `stateDir: ${path.join(stateDir, "state")}`,
    "gateway:",
    `  listen: ${(gateway = `127.0.0.1:${await freePort()}`)}`,
    "egress:",
    `  upstreams: [127.0.0.1:${resolver.address().port}]`,
    ...HOST_STATE.lines,
    ...dockerSection(PREFIX),
  ];
  writeFileSync(cfg, lines.join("\n") + "\n");
  ({ proc: server, apiKey: adminKey } = await startServer(BIN, cfg));
});

after(async () => {
  if (EXTERNAL) {
    await killSuite(config(adminKey), RUN);
    return;
  }
  if (server && server.exitCode === null) {
    await killSuite(config(adminKey), RUN);
    await stopServer(server);
  }
  removeContainers(PREFIX);
  if (stateDir) rmSync(stateDir, { recursive: true, force: true });
  cleanHostState(BIN, HOST_STATE);
  if (resolver) resolver.close();
});

// Alice's and Bob's keys and Alice's sandbox, shared by the tests below in order.
let alice, bob, sbx;

test("a user key works with the unchanged SDK, on its own sandboxes only", async () => {
  alice = await newKey(`alice-${RUN}`, "user");
  bob = await newKey(`bob-${RUN}`, "user");
  assert.match(alice.key, /^ak_/);

  sbx = await Sandbox.create({
    connectionConfig: config(alice.key),
    image: IMAGE,
    resource: EXTERNAL?.resource,
    metadata: { suite: RUN },
    timeoutSeconds: 600,
    readyTimeoutSeconds: 60,
  });
  const ex = await sbx.commands.run("echo hello-from-user");
  assert.equal(ex.error, undefined, JSON.stringify(ex.error));
  assert.deepEqual(ex.logs.stdout.map((m) => m.text), ["hello-from-user"]);
  const mine = await SandboxManager.create({ connectionConfig: config(alice.key) }).listSandboxInfos({});
  assert.deepEqual(mine.items.map((s) => s.id), [sbx.id]);

  // Bob: no list entry, and every route to Alice's sandbox is 404.
  const theirs = await SandboxManager.create({ connectionConfig: config(bob.key) }).listSandboxInfos({});
  assert.equal(theirs.items.length, 0);
  await assert.rejects(Sandbox.connect({ sandboxId: sbx.id, connectionConfig: config(bob.key) }), (e) => {
    assert.match(String(e?.message ?? e), /404|not found/i);
    return true;
  });
  for (const p of [`/v1/sandboxes/${sbx.id}`, `/v1/sandboxes/${sbx.id}/endpoints/44772`, `/v1/sandboxes/${sbx.id}/proxy/44772/ping`]) {
    const r = await fetch(`http://${domain}${p}`, { headers: { "OPEN-SANDBOX-API-KEY": bob.key } });
    assert.equal(r.status, 404, p);
  }
  // The gateway of `airlock up` admits a key by its role as the API does: Bob's user key
  // finds no sandbox of Alice's there either (404). A gateway that refuses API keys
  // (--refuse-api-key, the Kubernetes manifests) answers 401. Alice's endpoint, with its
  // token, works.
  const ep = await sbx.getEndpoint(44772);
  assert.equal(ep.endpoint, `${gateway}/sandboxes/${sbx.id}/proxy/44772`);
  assert.equal((await fetch(`http://${ep.endpoint}/ping`, { headers: { "OPEN-SANDBOX-API-KEY": bob.key } })).status, EXTERNAL ? 401 : 404);
  assert.equal((await fetch(`http://${ep.endpoint}/ping`, { headers: ep.headers })).status, 200);

  // The admin sees the sandbox and who created it.
  const info = await (await fetch(`http://${domain}/v1/sandboxes/${sbx.id}`, { headers: { "OPEN-SANDBOX-API-KEY": adminKey } })).json();
  assert.equal(info.airlock?.createdBy, alice.id);
});

test("the console: a user key signs in and is refused the audit log and others' sandboxes", async () => {
  // The console: Bob signs in with his key, sees his role, and is refused the audit log
  // and Alice's sandbox. On Kubernetes every lifecycle replica serves the console, its
  // sessions its own: the Service's sessionAffinity keeps these requests on one replica,
  // and the audit routes refuse the user's role before answering 501 (no audit there).
  const login = await fetch(`http://${domain}/console/login`, {
    method: "POST",
    redirect: "manual",
    headers: { "Content-Type": "application/x-www-form-urlencoded", Origin: `http://${domain}`, "Sec-Fetch-Site": "same-origin" },
    body: new URLSearchParams({ key: bob.key }),
  });
  assert.equal(login.status, 303);
  const cookie = login.headers.get("set-cookie").split(";")[0];
  const session = await (await fetch(`http://${domain}/console/api/session`, { headers: { Cookie: cookie } })).json();
  assert.equal(session.principal.role, "user");
  assert.equal(session.principal.id, bob.id);
  assert.equal((await fetch(`http://${domain}/console/api/audit`, { headers: { Cookie: cookie } })).status, 403);
  assert.equal((await fetch(`http://${domain}/console/api/v1/sandboxes/${sbx.id}`, { headers: { Cookie: cookie } })).status, 404);
  assert.equal((await fetch(`http://${domain}/console/api/v1/keys`, { headers: { Cookie: cookie } })).status, 403);
});

test("a revoked user key is refused", async () => {
  // Revoked: the SDK is refused within a second.
  const rv = await fetch(`http://${domain}/v1/keys/${alice.id}`, { method: "DELETE", headers: { "OPEN-SANDBOX-API-KEY": adminKey } });
  assert.equal(rv.status, 204);
  // Another lifecycle replica sharing the key store (Kubernetes) re-reads it every
  // 500 ms: from a second after the revocation, every replica refuses the key.
  if (EXTERNAL) await new Promise((r) => setTimeout(r, 1000));
  for (let i = 0; i < (EXTERNAL ? 4 : 1); i++) {
    await assert.rejects(SandboxManager.create({ connectionConfig: config(alice.key) }).listSandboxInfos({}));
  }
  await sbx.kill().catch(() => {}); // refused now; the admin's cleanup removes it
});
