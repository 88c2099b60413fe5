// What the SDK suites share: a loopback fake resolver, free ports, and a real
// `airlock up` started from a configuration file. Nothing here sends traffic off this
// machine.
import { execFileSync, spawn } from "node:child_process";
import { SandboxManager } from "@alibaba-group/opensandbox";
import dgram from "node:dgram";
import { readdirSync, readFileSync } from "node:fs";
import net from "node:net";
import path from "node:path";

// fakeResolver is the upstream DNS server egressd forwards to, on loopback: an A record
// for each name of names ({"allowed.test": [203, 0, 113, 10]}), NXDOMAIN for every other
// name.
export function fakeResolver(names) {
  return new Promise((resolve) => {
    const s = dgram.createSocket("udp4");
    s.on("message", (q, rinfo) => {
      let i = 12;
      const labels = [];
      while (q[i] !== 0) {
        labels.push(q.subarray(i + 1, i + 1 + q[i]).toString());
        i += q[i] + 1;
      }
      const qEnd = i + 5; // zero label, qtype, qclass
      const qtype = q.readUInt16BE(i + 1);
      const ip = names[labels.join(".").toLowerCase()];
      const hdr = Buffer.from(q.subarray(0, 12));
      hdr.writeUInt16BE(ip ? 0x8180 : 0x8183, 2); // response, RD, RA; rcode 0 or 3
      const answer = ip && qtype === 1;
      hdr.writeUInt16BE(answer ? 1 : 0, 6);
      hdr.writeUInt16BE(0, 8);
      hdr.writeUInt16BE(0, 10);
      const parts = [hdr, q.subarray(12, qEnd)];
      if (answer) parts.push(Buffer.from([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, ...ip]));
      s.send(Buffer.concat(parts), rinfo.port, rinfo.address);
    });
    s.bind(0, "127.0.0.1", () => resolve(s));
  });
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// startServer runs `bin up --config configPath` and resolves with { proc, apiKey, log }
// once it printed its API key (log() is everything it wrote to stderr so far); it
// rejects when the process exits first or nothing is printed within 90 s (then it is
// killed).
export function startServer(bin, configPath) {
  return new Promise((resolve, reject) => {
    const proc = spawn(bin, ["up", "--config", configPath], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let errLog = "";
    const log = () => errLog;
    const timer = setTimeout(() => {
      proc.kill("SIGKILL");
      reject(new Error(`airlock up printed no API key within 90 s:\n${out}\n${errLog}`));
    }, 90_000);
    proc.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/OPEN-SANDBOX-API-KEY: (\S+)/);
      if (m) {
        clearTimeout(timer);
        resolve({ proc, apiKey: m[1], log, stdout: () => out });
      }
    });
    proc.stderr.on("data", (d) => {
      errLog += d;
    });
    proc.once("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
    proc.once("exit", (code, sig) => {
      clearTimeout(timer);
      reject(new Error(`airlock up exited (code ${code}, signal ${sig}) before it was ready:\n${errLog}`));
    });
  });
}

// stopServer sends SIGTERM and waits for the exit.
export async function stopServer(proc) {
  if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
  const exited = new Promise((r) => proc.once("exit", r));
  proc.kill("SIGTERM");
  await exited;
}

// egressHostState is the host state of a test server's egress datapath, its own so that
// no other server on this host (another suite, a Go test, a real installation) shares
// it: an eBPF pin root and nftables tables (inet and netdev) named after the suite (tag)
// and this process. Distinct tables also mean distinct L7 marks (egressd derives its
// mark from the table name), so a killed server's l7_redirect chain never catches
// another server's sandboxes. lines are the airlock.yaml lines of the egress section;
// the names match the patterns .ci/run's `airlock down --purge-dead` cleans when a
// killed run left them.
export function egressHostState(tag) {
  const pinRoot = `/sys/fs/bpf/airlock-${tag}test-${process.pid}`;
  const nftTable = `altest_${tag}_${process.pid}`;
  return { pinRoot, nftTable, lines: [`  pinRoot: ${pinRoot}`, `  nftTable: ${nftTable}`] };
}

// cleanHostState removes what the stopped server of state (egressHostState) left on the
// host: its nftables tables and its pin root. egressd removes them itself at an orderly
// stop with no sandbox left; with held warm-pool members it keeps them (fail closed).
// `airlock down --purge-dead` removes them only when no live egressd holds them.
// Failures are printed, not thrown: the suite's result stands. Nothing in external-server
// mode.
export function cleanHostState(bin, state) {
  if (EXTERNAL || !bin) return;
  try {
    execFileSync(bin, ["down", "--purge-dead", state.nftTable, "--purge-dead", path.basename(state.pinRoot)], { stdio: "pipe" });
  } catch (err) {
    console.log(`# cleaning the server's host state: ${err.message}`);
  }
}

// dockerSection is the airlock.yaml docker section of a test server: its containers are
// named with prefix (so the test can remove what the server leaves running, such as
// held warm-pool members, which a real installation adopts on its next start), execd
// comes from $AIRLOCK_EXECD when set, and every sandbox runs under the engine runtime
// $AIRLOCK_DOCKER_RUNTIME when set (runsc: the suite on gVisor, `npm run test:gvisor`).
export function dockerSection(prefix) {
  const lines = ["docker:", `  namePrefix: ${prefix}`];
  if (process.env.AIRLOCK_EXECD) lines.push(`  execdPath: ${process.env.AIRLOCK_EXECD}`);
  if (process.env.AIRLOCK_DOCKER_RUNTIME) lines.push(`  runtime: ${process.env.AIRLOCK_DOCKER_RUNTIME}`);
  return lines;
}

// removeContainers force-removes every container whose name starts with prefix; it
// reports how many it removed.
export function removeContainers(prefix) {
  const ids = execFileSync("docker", ["ps", "-aq", "--filter", `name=^${prefix}`], { encoding: "utf8" })
    .split("\n")
    .filter(Boolean);
  if (ids.length > 0) execFileSync("docker", ["rm", "-f", ...ids], { stdio: "ignore" });
  return ids.length;
}

// killSuite kills every sandbox whose metadata.suite is run, ignoring failures (the
// server may be gone: then there is nothing to clean through it).
export async function killSuite(connectionConfig, run) {
  try {
    const mgr = SandboxManager.create({ connectionConfig });
    const left = await mgr.listSandboxInfos({ metadata: { suite: run }, pageSize: 100 });
    for (const sb of left.items) await mgr.killSandbox(sb.id).catch(() => {});
  } catch {
    // the server is gone
  }
}

// External-server mode: the suites run against an Airlock installation that is already
// up (Airlock deployed on Kubernetes by its manifests: internal/kubenode's
// TestSDKSuitesOnNode runs them so) instead of starting `airlock up` and a loopback
// fake resolver of their own. It is on when AIRLOCK_SDK_LIFECYCLE is set:
//   AIRLOCK_SDK_LIFECYCLE  host:port of the lifecycle API (the SDK's domain)
//   AIRLOCK_SDK_GATEWAY    host:port of the gateway, which sandbox endpoints name
//   AIRLOCK_SDK_API_KEY    the installation's OPEN-SANDBOX-API-KEY
//   AIRLOCK_SDK_RUNTIME    "kubernetes" or "docker" (default): which tests can run
//                          (dockerOnly)
//   AIRLOCK_SDK_NAMES      JSON object: each fake name of the suites ("allowed.test") to
//                          the name the installation's resolver answers with the same
//                          address (on the node: a headless Service of the cluster DNS,
//                          "allowed.<ns>.svc.cluster.local" → 203.0.113.10); pods reach
//                          the fake internet only through it (fakeName)
//   AIRLOCK_SDK_RESOURCE   JSON resource limits of every sandbox the suites create
//                          ({"cpu":"250m","memory":"512Mi"}: the node is small); unset:
//                          the SDK's default (1 CPU, 2 GiB)
//   AIRLOCK_SDK_FORK       how many sandboxes snapshot.test.mjs's fork makes (default 5;
//                          3 on the 2-core test node)
//   AIRLOCK_SDK_POOL       JSON warm pool to claim from: {"name", "size", "image",
//                          "resource", "domain"} (domain: the lifecycle replica holding
//                          the pool, the Lease holder on Kubernetes); unset: no pool test
//   AIRLOCK_SDK_UPSTREAM_DEV  the host interface whose addresses sandboxes reach (the
//                          node's bridge): the browser suite puts its sites' addresses
//                          there (/32) instead of a network namespace it routes
//   AIRLOCK_SDK_UPSTREAM_CA, AIRLOCK_SDK_UPSTREAM_CA_KEY  PEM files of the CA that the
//                          installation trusts for intercepted upstreams; the vault
//                          suite signs its servers' certificates with it
//   AIRLOCK_SDK_STATE_DIR  the installation's state on this host that the vault suite
//                          searches for secrets (the node's egressd folder)
//   AIRLOCK_SDK_AUDIT_DIR  the audit log the sandboxes' records are read from
//                          (auditRecords) when the lifecycle API serves none
//   AIRLOCK_SDK_CONTROL    base URL (http://127.0.0.1:PORT) of the installation's
//                          control interface, which does to it what the suites do to an
//                          `airlock up` of their own (control; on the node:
//                          internal/kubenode's egressdControl, acting on egressd):
//                            GET  /log      200 text: the server's log (egressd's pods')
//                            POST /restart  204 once the server is back (egressd's pods
//                                           deleted, the DaemonSet's new ones Ready)
//                            POST /reconfigure?vaultPlainHTTP=learned|policy  204 once
//                                           the server runs with that vault.plainHTTP
//                          (egressd --vault-plain-http, the rollout done); errors: 4xx/5xx
//                          with the reason as text. Unset: tests that need it skip
//                          (ownServerOrControl)
// EXTERNAL is null when the suites start their own server.
export const EXTERNAL = externalServer(process.env);

// externalServer reads the external-server mode from env (see EXTERNAL); it throws when
// AIRLOCK_SDK_LIFECYCLE is set without the gateway or the key, or a JSON value is invalid.
export function externalServer(env) {
  if (!env.AIRLOCK_SDK_LIFECYCLE) return null;
  if (!env.AIRLOCK_SDK_GATEWAY || !env.AIRLOCK_SDK_API_KEY) {
    throw new Error("AIRLOCK_SDK_LIFECYCLE needs AIRLOCK_SDK_GATEWAY and AIRLOCK_SDK_API_KEY");
  }
  const json = (name) => (env[name] ? JSON.parse(env[name]) : undefined);
  return {
    domain: env.AIRLOCK_SDK_LIFECYCLE,
    gateway: env.AIRLOCK_SDK_GATEWAY,
    apiKey: env.AIRLOCK_SDK_API_KEY,
    runtime: env.AIRLOCK_SDK_RUNTIME ?? "docker",
    names: json("AIRLOCK_SDK_NAMES") ?? {},
    resource: json("AIRLOCK_SDK_RESOURCE"),
    pool: json("AIRLOCK_SDK_POOL"),
    upstreamDev: env.AIRLOCK_SDK_UPSTREAM_DEV,
    upstreamCA: env.AIRLOCK_SDK_UPSTREAM_CA,
    upstreamCAKey: env.AIRLOCK_SDK_UPSTREAM_CA_KEY,
    stateDir: env.AIRLOCK_SDK_STATE_DIR,
    auditDir: env.AIRLOCK_SDK_AUDIT_DIR,
    control: env.AIRLOCK_SDK_CONTROL,
  };
}

// fakeName is the name under which sandboxes resolve the suites' fake name: itself
// with a server of the suite's own, the mapped name in external-server mode.
export function fakeName(name) {
  return EXTERNAL?.names[name] ?? name;
}

// dockerOnly is the options of a test that needs the Docker runtime: in external-server
// mode against Kubernetes the test is skipped with why printed (node:test's SKIP);
// otherwise it runs. Nothing is skipped when the suite starts its own `airlock up`.
export function dockerOnly(why) {
  if (EXTERNAL && EXTERNAL.runtime !== "docker") {
    const reason = `Docker only (${EXTERNAL.runtime}): ${why}`;
    console.log(`# skipped in external-server mode: ${reason}`);
    return { skip: reason };
  }
  return {};
}

// ownServerOnly is the options of a test that restarts, reconfigures or reads the
// private files of the suite's own `airlock up`: in external-server mode it is skipped
// with why printed; otherwise it runs.
export function ownServerOnly(why) {
  if (EXTERNAL) {
    const reason = `needs the suite's own airlock up: ${why}`;
    console.log(`# skipped in external-server mode: ${reason}`);
    return { skip: reason };
  }
  return {};
}

// ownServerOrControl is the options of a test that restarts, reconfigures or reads the
// log of the server: it runs with a server of the suite's own, and in external-server
// mode through the control interface (AIRLOCK_SDK_CONTROL, control); without one it is
// skipped with why printed.
export function ownServerOrControl(why) {
  if (EXTERNAL && !EXTERNAL.control) {
    const reason = `needs the suite's own airlock up or AIRLOCK_SDK_CONTROL: ${why}`;
    console.log(`# skipped in external-server mode: ${reason}`);
    return { skip: reason };
  }
  return {};
}

// control sends method route ("/restart", "/reconfigure?vaultPlainHTTP=policy") to the
// external installation's control interface (AIRLOCK_SDK_CONTROL) and returns the
// answer's text; it throws when there is none or the answer is not a 2xx.
export async function control(method, route) {
  if (!EXTERNAL?.control) throw new Error("no control interface: AIRLOCK_SDK_CONTROL is not set");
  const res = await fetch(`${EXTERNAL.control}${route}`, { method });
  const body = await res.text();
  if (!res.ok) throw new Error(`${method} ${route} on the control interface: ${res.status} ${body}`);
  return body;
}

// auditRecords returns sandbox id's audit records: from the audit log's files on this
// host in external-server mode with AIRLOCK_SDK_AUDIT_DIR set (every *.jsonl file, as
// egressd writes them), otherwise from GET /v1/sandboxes/{id}/audit of domain.
export async function auditRecords(domain, apiKey, id) {
  if (EXTERNAL?.auditDir) {
    const recs = [];
    for (const f of readdirSync(EXTERNAL.auditDir).filter((f) => f.endsWith(".jsonl")).sort()) {
      for (const l of readFileSync(path.join(EXTERNAL.auditDir, f), "utf8").split("\n")) {
        if (!l.startsWith("{")) continue;
        const r = JSON.parse(l);
        if (r.sandbox_id === id) recs.push(r);
      }
    }
    return recs;
  }
  const res = await fetch(`http://${domain}/v1/sandboxes/${id}/audit?limit=10000`, { headers: { "OPEN-SANDBOX-API-KEY": apiKey } });
  const body = await res.text();
  if (res.status !== 200) throw new Error(`GET /v1/sandboxes/${id}/audit: ${res.status} ${body}`);
  return JSON.parse(body).records ?? JSON.parse(body);
}
