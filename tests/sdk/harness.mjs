// What the SDK suites share: a loopback fake resolver, free ports, and a real
// `airlock up` started from a configuration file. Nothing here sends traffic off this
// machine.
import { execFileSync, spawn } from "node:child_process";
import { SandboxManager } from "@alibaba-group/opensandbox";
import dgram from "node:dgram";
import net from "node:net";

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
