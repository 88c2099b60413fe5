// The code interpreter through the OpenSandbox JavaScript SDK against a real `airlock up`:
// a sandbox of the image the SDKs name by default (opensandbox/code-interpreter:latest,
// which airlock up's image alias maps to airlock/code-interpreter:latest), its commands
// and files, and per language a context that keeps state, reports errors, is interrupted
// and streams its output. The server runs on loopback with a temporary state directory;
// in the harness's external-server mode (AIRLOCK_SDK_LIFECYCLE: see harness.mjs) the
// suite uses an installation already up instead (Airlock on the one-node Kubernetes
// cluster, which has no image aliases: AIRLOCK_TEST_CI_IMAGE names the imported image).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { ConnectionConfig, Sandbox } from "@alibaba-group/opensandbox";
import { CodeInterpreter, SupportedLanguage } from "./codeinterpreter.mjs";
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
const HOST_STATE = egressHostState("ci");
const IMAGE = process.env.AIRLOCK_TEST_CI_IMAGE ?? "opensandbox/code-interpreter:latest";
const RUN = `ci${process.pid}`;
const PREFIX = `altest-sdk-ci${process.pid}-`;

let server;
let stateDir;
let domain;
let apiKey;
let resolver;
let sbx;
let ci;

function config() {
  return new ConnectionConfig({ domain, apiKey, requestTimeoutSeconds: 120 });
}

before(async () => {
  if (EXTERNAL) {
    ({ domain, apiKey } = EXTERNAL);
    return;
  }
  assert.ok(BIN, "AIRLOCK_BIN must name the airlock binary (make sdk-test sets it)");
  stateDir = mkdtempSync(path.join(os.tmpdir(), "airlock-ci-"));
  domain = `127.0.0.1:${await freePort()}`;
  resolver = await fakeResolver({});
  const lines = [
    `listen: ${domain}`,
    `stateDir: ${path.join(stateDir, "state")}`,
    "gateway:",
    `  listen: 127.0.0.1:${await freePort()}`,
    "egress:",
    `  upstreams: [127.0.0.1:${resolver.address().port}]`,
    ...HOST_STATE.lines,
  ];
  lines.push(...dockerSection(PREFIX));
  const cfg = path.join(stateDir, "airlock.yaml");
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

test("a code-interpreter sandbox from the SDKs' default image name", async () => {
  sbx = await Sandbox.create({
    connectionConfig: config(),
    image: IMAGE,
    resource: EXTERNAL?.resource,
    entrypoint: ["/opt/code-interpreter/code-interpreter.sh"],
    metadata: { suite: RUN },
    timeoutSeconds: 900,
    readyTimeoutSeconds: 120,
  });
  ci = await CodeInterpreter.create(sbx);
  const info = await sbx.getInfo();
  assert.equal(info.status.state, "Running");
  assert.equal(info.image?.uri ?? info.image, IMAGE, "the sandbox reports the image it was asked for");
});

test("commands and files in the code-interpreter image", async () => {
  const ex = await ci.commands.run("node --version; python3 --version; echo $NODE_PATH");
  assert.equal(ex.error, undefined, JSON.stringify(ex.error));
  const out = ex.logs.stdout.map((m) => m.text);
  assert.match(out[0], /^v\d+\./);
  assert.match(out[1], /^Python 3\./);
  assert.equal(out[2], "/usr/local/lib/node_modules");
  await ci.files.writeFiles([{ path: "/workspace/ci/data.json", data: '{"n": 41}', mode: 644 }]);
  assert.equal(await ci.files.readFile("/workspace/ci/data.json"), '{"n": 41}');
  const r = await ci.codes.run('import json\nprint(json.load(open("/workspace/ci/data.json"))["n"] + 1)', {
    language: SupportedLanguage.PYTHON,
  });
  assert.deepEqual(r.logs.stdout.map((m) => m.text.trim()), ["42"]);
});

// Per language: define, read back (state kept), an error by name with a traceback, read
// again, an interrupted loop, read again, and three prints streamed in order.
const cases = [
  {
    language: SupportedLanguage.PYTHON,
    define: "x = 41", read: "print(x + 1)", fail: "1 / 0", ename: "ZeroDivisionError",
    loop: "while True:\n    pass",
    stream: "import time\nfor i in (1, 2, 3):\n    print(i, flush=True)\n    time.sleep(0.4)",
  },
  {
    language: SupportedLanguage.JAVASCRIPT,
    define: "var x = 41", read: "console.log(x + 1)", fail: "[].reduce((a, b) => a + b)", ename: "TypeError",
    loop: "while (true) {}",
    stream: "for (const i of [1, 2, 3]) {\n  console.log(i);\n  await new Promise((r) => setTimeout(r, 400));\n}",
  },
  {
    language: SupportedLanguage.TYPESCRIPT,
    define: "let x: number = 41", read: "console.log(x + 1)", fail: 'throw new RangeError("out of range")', ename: "RangeError",
    loop: "while (true) {}",
    stream: "for (const i of [1, 2, 3]) {\n  console.log(i);\n  await new Promise<void>((r) => setTimeout(r, 400));\n}",
  },
  {
    language: SupportedLanguage.GO,
    define: 'import "fmt"\nx := 41', read: "fmt.Println(x + 1)", fail: 'var m map[string]int\nm["a"] = 1', ename: "panic",
    loop: "spin := 0\nfor {\n\tspin++\n}",
    stream: 'import "time"\nfor i := 1; i <= 3; i++ {\n\tfmt.Println(i)\n\ttime.Sleep(400 * time.Millisecond)\n}',
  },
  {
    language: SupportedLanguage.BASH,
    define: "x=41", read: "echo $((x + 1))", fail: "ls /nonexistent", ename: "CommandExecError",
    loop: "while true; do :; done",
    stream: "for i in 1 2 3; do echo $i; sleep 0.4; done",
  },
];

for (const c of cases) {
  test(`${c.language}: state, error, interrupt, streaming`, async () => {
    const context = await ci.codes.createContext(c.language);
    assert.equal(context.language, c.language);
    const readsState = async (when) => {
      const r = await ci.codes.run(c.read, { context });
      assert.equal(r.error, undefined, `${when}: ${JSON.stringify(r.error)}`);
      assert.equal(r.logs.stdout.map((m) => m.text).join("").trim(), "42", when);
    };

    let r = await ci.codes.run(c.define, { context });
    assert.equal(r.error, undefined, JSON.stringify(r.error));
    await readsState("second run");

    r = await ci.codes.run(c.fail, { context });
    assert.equal(r.error?.name, c.ename, JSON.stringify(r.error));
    assert.ok(r.error.traceback?.length > 0, "the error has a traceback");
    await readsState("after an error");

    let started;
    const initSeen = new Promise((resolve) => (started = resolve));
    const looping = ci.codes.run(c.loop, { context, handlers: { onInit: () => started() } });
    await initSeen;
    await new Promise((res) => setTimeout(res, 1000));
    // A kernel under load may not be in the loop yet when the first SIGINT lands (tslab
    // drops an interrupt that finds nothing running): interrupt again every 5 s.
    const t0 = Date.now();
    let ended = false;
    looping.finally(() => (ended = true)).catch(() => {});
    while (!ended && Date.now() - t0 < 20_000) {
      await ci.codes.interrupt(context.id);
      for (let i = 0; i < 50 && !ended; i++) await new Promise((res) => setTimeout(res, 100));
    }
    assert.ok(ended, "the loop stopped within 20 s of the first interrupt");
    r = await looping;
    assert.ok(r.error, "an interrupted loop ends with an error");
    await readsState("after an interrupt");

    const seen = [];
    let completeAt;
    r = await ci.codes.run(c.stream, {
      context,
      handlers: {
        onStdout: (m) => seen.push({ text: m.text.trim(), at: Date.now() }),
        onExecutionComplete: () => (completeAt = Date.now()),
      },
    });
    assert.equal(r.error, undefined, JSON.stringify(r.error));
    assert.deepEqual(seen.map((s) => s.text), ["1", "2", "3"], "three separate stdout events, in order");
    assert.ok(completeAt - seen[0].at >= 600, `the first line came ${completeAt - seen[0].at} ms before the end: not streamed`);
    await ci.codes.deleteContext(context.id);
  });
}

test("kill the code-interpreter sandbox", async () => {
  await sbx.kill();
});
