// A stand-in for the OpenSandbox code-interpreter SDK
// (@alibaba-group/opensandbox-code-interpreter), which the npm registry this project
// can reach does not serve. It has the published package's surface that the tests use
// (CodeInterpreter.create(sandbox), .codes.createContext/run/interrupt/deleteContext,
// .commands, .files) and speaks execd's /code API the way that package does: through the
// sandbox's execd endpoint and its headers, results built by the published base SDK's
// ExecutionEventDispatcher. Replace the import with the real package once it can be
// installed; the tests should not change.
import { DEFAULT_EXECD_PORT, ExecutionEventDispatcher } from "@alibaba-group/opensandbox";

export const SupportedLanguage = {
  PYTHON: "python",
  JAVA: "java",
  GO: "go",
  TYPESCRIPT: "typescript",
  JAVASCRIPT: "javascript",
  BASH: "bash",
};

class Codes {
  constructor(base, headers) {
    this.base = base;
    this.headers = headers;
  }

  async #request(method, path, body) {
    const res = await fetch(this.base + path, {
      method,
      headers: { ...this.headers, ...(body ? { "content-type": "application/json" } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
    if (!res.ok) {
      const text = await res.text();
      throw new Error(`${method} ${path}: ${res.status} ${text}`);
    }
    return res;
  }

  async createContext(language) {
    const ctx = await (await this.#request("POST", "/code/context", { language })).json();
    return { id: ctx.id, language: ctx.language };
  }

  async deleteContext(id) {
    await this.#request("DELETE", `/code/contexts/${encodeURIComponent(id)}`);
  }

  async interrupt(id) {
    await this.#request("DELETE", `/code?id=${encodeURIComponent(id)}`);
  }

  // run streams the events of POST /code into handlers and returns the Execution.
  async run(code, { context, language, handlers } = {}) {
    const ctx = context ?? { language: language ?? "python" };
    const res = await fetch(this.base + "/code", {
      method: "POST",
      headers: { accept: "text/event-stream", "content-type": "application/json", ...this.headers },
      body: JSON.stringify({ code, context: { id: ctx.id, language: ctx.language } }),
    });
    if (!res.ok) throw new Error(`POST /code: ${res.status} ${await res.text()}`);
    const execution = { logs: { stdout: [], stderr: [] }, result: [] };
    const dispatcher = new ExecutionEventDispatcher(execution, handlers);
    const decoder = new TextDecoder();
    let buf = "";
    for await (const chunk of res.body) {
      buf += decoder.decode(chunk, { stream: true });
      let i;
      while ((i = buf.indexOf("\n")) >= 0) {
        let line = buf.slice(0, i).trim();
        buf = buf.slice(i + 1);
        if (line.startsWith("data:")) line = line.slice(5).trim();
        if (!line || line.startsWith(":")) continue;
        await dispatcher.dispatch(JSON.parse(line));
      }
    }
    return execution;
  }
}

export class CodeInterpreter {
  constructor(sandbox, codes) {
    this.sandbox = sandbox;
    this.codes = codes;
  }

  static async create(sandbox) {
    const ep = await sandbox.getEndpoint(DEFAULT_EXECD_PORT);
    const base = `${sandbox.connectionConfig.protocol}://${ep.endpoint}`;
    return new CodeInterpreter(sandbox, new Codes(base, ep.headers ?? {}));
  }

  get id() {
    return this.sandbox.id;
  }

  get files() {
    return this.sandbox.files;
  }

  get commands() {
    return this.sandbox.commands;
  }
}
