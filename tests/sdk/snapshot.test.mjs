// Snapshots and restore (sandbox-lifecycle.yml: /snapshots, /snapshots/{snapshotId},
// /sandboxes/{sandboxId}/snapshots, CreateSandboxRequest.snapshotId) through the
// published OpenSandbox JavaScript SDK against a real `airlock up` on this host: create,
// poll to Ready, list with filters and pages, restore with the request's env and
// metadata, read the files back, independence of source and restore (the restore
// survives the source's delete), delete and 404 after, and the spec's error cases. The
// same tests run in the harness's external-server mode against Kubernetes
// (AIRLOCK_SDK_RUNTIME=kubernetes: see harness.mjs; internal/kubenode's
// TestSDKSuitesOnNode), where the node's egressd commits the pod's container into an
// image kept on that node and restores run there; the sandboxes then take the
// harness's resource limits (AIRLOCK_SDK_RESOURCE), and the fork makes
// AIRLOCK_SDK_FORK sandboxes (default 5) so that they fit on a small node.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { ConnectionConfig, Sandbox, SandboxException, SandboxManager } from "@alibaba-group/opensandbox";
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
const IMAGE = process.env.AIRLOCK_TEST_IMAGE ?? "airlock/sandbox:latest";
const RUN = `snap${process.pid}`;
const PREFIX = `altest-sdk-snap${process.pid}-`;
// The resource limits of every sandbox made here (the harness's on a small node).
const RESOURCE = EXTERNAL?.resource ?? { cpu: "1", memory: "512Mi" };
// How many sandboxes the fork makes.
const FORK = Number(process.env.AIRLOCK_SDK_FORK ?? 5);
const HOST_STATE = egressHostState("snap");

let server;
let stateDir;
let domain;
let apiKey;
let resolver;
let mgr;
const snapshots = []; // every snapshot id made, deleted at the end

function config() {
  return new ConnectionConfig({ domain, apiKey, requestTimeoutSeconds: 60 });
}

// api calls the lifecycle API directly (for what the SDK refuses before sending).
async function api(method, p, body) {
  const res = await fetch(`http://${domain}/v1${p}`, {
    method,
    headers: { "OPEN-SANDBOX-API-KEY": apiKey, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null };
}

async function out(sbx, cmd) {
  const ex = await sbx.commands.run(cmd);
  assert.equal(ex.error, undefined, `${cmd}: ${JSON.stringify(ex.error)}`);
  return ex.logs.stdout.map((m) => m.text).join("\n");
}

// waitReady polls the snapshot until it leaves Creating (at most 3 min) and checks it
// is Ready.
async function waitReady(id) {
  for (let i = 0; i < 900; i++) {
    const sn = await mgr.getSnapshot(id);
    if (sn.status.state !== "Creating") {
      assert.equal(sn.status.state, "Ready", JSON.stringify(sn));
      return sn;
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`snapshot ${id} still Creating after 3 min`);
}

async function rejectsWith(promise, status) {
  await assert.rejects(promise, (err) => err instanceof SandboxException && err.statusCode === status);
}

before(async () => {
  if (EXTERNAL) {
    ({ domain, apiKey } = EXTERNAL);
    mgr = SandboxManager.create({ connectionConfig: config() });
    return;
  }
  assert.ok(BIN, "AIRLOCK_BIN must name the airlock binary (make sdk-test sets it)");
  stateDir = mkdtempSync(path.join(os.tmpdir(), "airlock-snap-"));
  domain = `127.0.0.1:${await freePort()}`;
  resolver = await fakeResolver({ "allowed.test": [203, 0, 113, 10] });
  const cfg = path.join(stateDir, "airlock.yaml");
  const lines = [
    `listen: ${domain}`,
    `stateDir: ${path.join(stateDir, "state")}`,
    "gateway:",
    `  listen: 127.0.0.1:${await freePort()}`,
    "egress:",
    `  upstreams: [127.0.0.1:${resolver.address().port}]`,
    ...HOST_STATE.lines,
    ...dockerSection(PREFIX),
  ];
  writeFileSync(cfg, lines.join("\n") + "\n");
  ({ proc: server, apiKey } = await startServer(BIN, cfg));
  mgr = SandboxManager.create({ connectionConfig: config() });
});

after(async () => {
  if (EXTERNAL) {
    for (const id of snapshots) await mgr.deleteSnapshot(id).catch(() => {});
    await killSuite(config(), RUN);
    return;
  }
  if (server && server.exitCode === null) {
    for (const id of snapshots) await mgr.deleteSnapshot(id).catch(() => {});
    await killSuite(config(), RUN);
    await stopServer(server);
  }
  removeContainers(PREFIX);
  for (const id of snapshots) {
    try {
      execFileSync("docker", ["rmi", "-f", `airlock/snapshot:${id.toLowerCase()}`], { stdio: "ignore" });
    } catch {
      // already gone
    }
  }
  if (stateDir) rmSync(stateDir, { recursive: true, force: true });
  cleanHostState(BIN, HOST_STATE);
  if (resolver) resolver.close();
});

let source;
let snap; // the first snapshot, Ready
let restored;

test("error cases answer as the spec says", async () => {
  await rejectsWith(mgr.getSnapshot("snap-nosuch"), 404);
  await rejectsWith(mgr.deleteSnapshot("snap-nosuch"), 404);
  await rejectsWith(mgr.createSnapshot("nosuch"), 404);
  const base = { entrypoint: ["tail", "-f", "/dev/null"], resourceLimits: { cpu: "1", memory: "512Mi" }, timeout: 600 };
  const both = await api("POST", "/sandboxes", { ...base, image: { uri: IMAGE }, snapshotId: "snap-x" });
  assert.equal(both.status, 400, JSON.stringify(both.body));
  const neither = await api("POST", "/sandboxes", base);
  assert.equal(neither.status, 400, JSON.stringify(neither.body));
  await rejectsWith(Sandbox.create({ connectionConfig: config(), snapshotId: "snap-nosuch", metadata: { suite: RUN } }), 404);
});

test("create a snapshot and poll it to Ready", async () => {
  source = await Sandbox.create({
    connectionConfig: config(),
    image: IMAGE,
    resource: EXTERNAL?.resource,
    metadata: { suite: RUN, role: "source" },
    env: { FOO: "source", KEEP: "kept" },
    timeoutSeconds: 600,
  });
  await source.files.writeFiles([{ path: "/srv/work/notes.txt", data: "written before the snapshot" }]);
  await out(source, "echo hello > /root/state.txt");
  const acc = await mgr.createSnapshot(source.id, { name: "first" });
  snapshots.push(acc.id);
  assert.equal(acc.sandboxId, source.id);
  assert.equal(acc.name, "first");
  assert.equal(acc.status.state, "Creating");
  assert.equal(acc.status.reason, "snapshot_accepted");
  assert.equal(acc.status.message, "Snapshot creation accepted.");
  assert.ok(acc.createdAt instanceof Date);
  snap = await waitReady(acc.id);
  assert.equal(snap.status.reason, "snapshot_ready");
  assert.ok(snap.status.lastTransitionAt > acc.status.lastTransitionAt, "lastTransitionAt moves forward");
});

test("list snapshots with filters and pages", async () => {
  const second = await mgr.createSnapshot(source.id);
  snapshots.push(second.id);
  await waitReady(second.id);
  const mine = await mgr.listSnapshots({ sandboxId: source.id });
  assert.deepEqual(mine.items.map((s) => s.id).sort(), [snap.id, second.id].sort());
  assert.equal(mine.pagination.totalItems, 2);
  const ready = await mgr.listSnapshots({ sandboxId: source.id, states: ["Ready", "Failed"] });
  assert.equal(ready.items.length, 2);
  const creating = await mgr.listSnapshots({ sandboxId: source.id, states: ["Creating"] });
  assert.equal(creating.items.length, 0);
  const p1 = await mgr.listSnapshots({ sandboxId: source.id, page: 1, pageSize: 1 });
  const p2 = await mgr.listSnapshots({ sandboxId: source.id, page: 2, pageSize: 1 });
  assert.equal(p1.items.length, 1);
  assert.equal(p2.items.length, 1);
  assert.notEqual(p1.items[0].id, p2.items[0].id);
  assert.deepEqual(p1.pagination, { page: 1, pageSize: 1, totalItems: 2, totalPages: 2, hasNextPage: true });
  assert.deepEqual(p2.pagination, { page: 2, pageSize: 1, totalItems: 2, totalPages: 2, hasNextPage: false });
  await mgr.deleteSnapshot(second.id);
  await rejectsWith(mgr.getSnapshot(second.id), 404);
});

test("restore: the snapshot's files, the request's env and metadata", async () => {
  restored = await Sandbox.create({
    connectionConfig: config(),
    snapshotId: snap.id,
    resource: EXTERNAL?.resource,
    metadata: { suite: RUN, role: "restored" },
    env: { FOO: "restored" },
    timeoutSeconds: 900,
  });
  assert.notEqual(restored.id, source.id);
  const info = await restored.getInfo();
  assert.equal(info.status.state, "Running");
  assert.equal(info.snapshotId, snap.id);
  assert.equal(info.metadata.role, "restored");
  assert.ok(info.expiresAt > new Date(Date.now() + 800_000), "expiry from the request's timeout");
  assert.equal(await restored.files.readFile("/srv/work/notes.txt"), "written before the snapshot");
  assert.equal(await out(restored, "cat /root/state.txt"), "hello");
  assert.equal(await out(restored, "echo $FOO $KEEP"), "restored kept");
});

test("source and restore are independent; the restore survives the source's delete", async () => {
  await out(restored, "echo changed > /root/state.txt");
  assert.equal(await out(source, "cat /root/state.txt"), "hello");
  await out(source, "echo source-only > /root/later.txt");
  assert.equal(await out(restored, "cat /root/later.txt 2>/dev/null || echo absent"), "absent");
  await source.kill();
  assert.equal(await out(restored, "cat /root/state.txt"), "changed");
  const still = await mgr.listSnapshots({ sandboxId: source.id });
  assert.deepEqual(still.items.map((s) => s.id), [snap.id], "a snapshot outlives its source");
});

test(`fork: airlock.dev/count restores ${FORK} sandboxes in one call`, async () => {
  const res = await api("POST", "/sandboxes", {
    snapshotId: snap.id,
    timeout: 600,
    resourceLimits: RESOURCE,
    metadata: { suite: RUN, role: "fork" },
    extensions: { "airlock.dev/count": String(FORK) },
  });
  assert.equal(res.status, 202, JSON.stringify(res.body));
  const ids = res.body.items.map((sb) => sb.id);
  assert.equal(new Set(ids).size, FORK);
  assert.equal(res.body.id, ids[0], "the body is the first sandbox");
  const forks = [];
  for (const id of ids) forks.push(await Sandbox.connect({ sandboxId: id, connectionConfig: config() }));
  for (const f of forks) {
    for (let i = 0; i < 300 && (await f.getInfo()).status.state !== "Running"; i++) await new Promise((r) => setTimeout(r, 200));
    assert.equal((await f.getInfo()).snapshotId, snap.id);
    assert.equal(await out(f, "cat /root/state.txt"), "hello");
  }
  await out(forks[0], "echo mine > /root/state.txt");
  assert.equal(await out(forks[1], "cat /root/state.txt"), "hello", "forks do not share writes");
  for (const f of forks) await f.kill();
});

test("delete a snapshot: 404 after, its restore keeps running", async () => {
  await mgr.deleteSnapshot(snap.id);
  await rejectsWith(mgr.getSnapshot(snap.id), 404);
  await rejectsWith(mgr.deleteSnapshot(snap.id), 404);
  await rejectsWith(Sandbox.create({ connectionConfig: config(), snapshotId: snap.id, metadata: { suite: RUN } }), 404);
  assert.equal(await out(restored, "cat /srv/work/notes.txt"), "written before the snapshot");
  await restored.kill();
});
