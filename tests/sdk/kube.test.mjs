// The published OpenSandbox JavaScript SDK against Airlock's control plane in
// Kubernetes mode: a real kube-apiserver, `airlock lifecycle`'s replica (Kubernetes
// runtime, cluster store) and the gateway, with sandbox pods run as real Docker
// containers by the test kubelet. The Go test TestSDKOnKubernetes
// (lifecycle/conformance) starts all of it and runs this file with
// AIRLOCK_KUBE_DOMAIN, AIRLOCK_KUBE_GATEWAY and AIRLOCK_KUBE_API_KEY set; `make
// sdk-test` runs that Go test. TestAirlockOnNode (internal/kubenode) runs it too,
// against Airlock deployed by its manifests on the one-node cluster (make kube-up). Egress enforcement belongs to egressd on the nodes,
// which this suite does not run: the policy API is checked as stored.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { ConnectionConfig, Sandbox, SandboxException, SandboxManager } from "@alibaba-group/opensandbox";
import { killSuite } from "./harness.mjs";

const domain = process.env.AIRLOCK_KUBE_DOMAIN;
const gateway = process.env.AIRLOCK_KUBE_GATEWAY;
const apiKey = process.env.AIRLOCK_KUBE_API_KEY;
const IMAGE = process.env.AIRLOCK_TEST_IMAGE ?? "airlock/sandbox:latest";
const RUN = `kube${process.pid}`;
// Small enough that two sandboxes (requests = limits) fit beside Airlock on the 2-core
// one-node cluster; the SDK's default is 1 CPU and 2 GiB.
const RESOURCE = { cpu: "250m", memory: "512Mi" };

function config() {
  return new ConnectionConfig({ domain, apiKey, requestTimeoutSeconds: 60 });
}

let sbx;

before(() => {
  assert.ok(domain && gateway && apiKey, "run through the Go test TestSDKOnKubernetes (make sdk-test)");
});

after(async () => {
  await killSuite(config(), RUN);
});

test("create a pod-backed sandbox, then getInfo", async () => {
  sbx = await Sandbox.create({
    connectionConfig: config(),
    image: IMAGE,
    resource: RESOURCE,
    metadata: { suite: RUN, role: "main" },
    env: { GREETING: "hello-from-kube" },
    timeoutSeconds: 600,
    readyTimeoutSeconds: 90,
  });
  const info = await sbx.getInfo();
  assert.equal(info.status.state, "Running");
  assert.equal(info.metadata.role, "main");
  assert.deepEqual(info.entrypoint, ["tail", "-f", "/dev/null"]);
});

test("endpoints point through the gateway and need the token", async () => {
  const ep = await sbx.getEndpoint(44772);
  assert.equal(ep.endpoint, `${gateway}/sandboxes/${sbx.id}/proxy/44772`);
  const url = `http://${ep.endpoint}/ping`;
  assert.equal((await fetch(url)).status, 401);
  assert.equal((await fetch(url, { headers: ep.headers })).status, 200);
});

test("commands: foreground with env, exit codes, background, sessions", async () => {
  const ex = await sbx.commands.run("echo $GREETING; echo line2");
  assert.deepEqual(ex.logs.stdout.map((m) => m.text), ["hello-from-kube", "line2"]);
  const bad = await sbx.commands.run("exit 3");
  assert.equal(bad.error.value ?? bad.error.evalue, "3");
  const bg = await sbx.commands.run("echo bg-out; sleep 1; echo bg-done", { background: true });
  let status;
  for (let i = 0; i < 100; i++) {
    status = await sbx.commands.getCommandStatus(bg.id);
    if (!status.running) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  assert.equal(status.exitCode, 0);
  const sid = await sbx.commands.createSession();
  await sbx.commands.runInSession(sid, "cd /tmp && export V=7");
  const s = await sbx.commands.runInSession(sid, 'echo "$V $(pwd)"');
  assert.deepEqual(s.logs.stdout.map((m) => m.text), ["7 /tmp"]);
});

test("files: write, read, search", async () => {
  await sbx.files.writeFiles([{ path: "/tmp/kf/hello.txt", data: "Hello Kube", mode: 644 }]);
  assert.equal(await sbx.files.readFile("/tmp/kf/hello.txt"), "Hello Kube");
  const found = await sbx.files.search({ path: "/tmp/kf", pattern: "*.txt" });
  assert.deepEqual(found.map((f) => f.path), ["/tmp/kf/hello.txt"]);
});

test("list filters, metadata patch, renew", async () => {
  const mgr = SandboxManager.create({ connectionConfig: config() });
  const hit = await mgr.listSandboxInfos({ states: ["Running"], metadata: { suite: RUN, role: "main" } });
  assert.deepEqual(hit.items.map((s) => s.id), [sbx.id]);
  const info = await sbx.patchMetadata({ extra: "1", role: null });
  assert.equal(info.metadata.extra, "1");
  assert.equal(info.metadata.role, undefined);
  const beforeExp = (await sbx.getInfo()).expiresAt;
  const res = await sbx.renew(1800);
  assert.ok(new Date(res.expiresAt) > beforeExp);
});

// AIRLOCK_KUBE_PAUSE=1 (TestAirlockOnNode: lifecycle --snapshots, egressd
// --containerd-socket): pause commits the pod into an image on its node and deletes it,
// resume makes it again under the same id, the files kept. Without snapshots
// (TestSDKOnKubernetes's test kubelet) both answer 501 naming the alternatives.
test("pause and resume on Kubernetes", async () => {
  if (process.env.AIRLOCK_KUBE_PAUSE !== "1") {
    await assert.rejects(sbx.pause(), (err) => err instanceof SandboxException && err.statusCode === 501);
    assert.equal((await sbx.getInfo()).status.state, "Running");
    return;
  }
  await sbx.pause();
  assert.equal((await sbx.getInfo()).status.state, "Paused");
  sbx = await sbx.resume({ readyTimeoutSeconds: 120 });
  const info = await sbx.getInfo();
  assert.equal(info.status.state, "Running");
  assert.equal(await sbx.files.readFile("/tmp/kf/hello.txt"), "Hello Kube");
  const ex = await sbx.commands.run("echo $GREETING");
  assert.deepEqual(ex.logs.stdout.map((m) => m.text), ["hello-from-kube"]);
});

test("egress policy through the egress API (stored; egressd enforces it on the node)", async () => {
  const pol = await Sandbox.create({
    connectionConfig: config(),
    image: IMAGE,
    resource: RESOURCE,
    metadata: { suite: RUN, role: "egress" },
    networkPolicy: { defaultAction: "deny", egress: [{ action: "allow", target: "allowed.test" }] },
    timeoutSeconds: 600,
    readyTimeoutSeconds: 90,
  });
  try {
    assert.deepEqual((await pol.getEgressPolicy()).egress.map((r) => r.target), ["allowed.test"]);
    await pol.patchEgressRules([{ action: "allow", target: "10.9.0.0/16" }]);
    assert.deepEqual((await pol.getEgressPolicy()).egress.map((r) => r.target), ["10.9.0.0/16", "allowed.test"]);
  } finally {
    await pol.kill();
  }
});

test("kill removes the sandbox", async () => {
  await sbx.kill();
  await assert.rejects(sbx.getInfo(), (err) => err instanceof SandboxException && err.statusCode === 404);
});
