/**
 * The client: `Cordon` (the service), `Sandbox` (one live sandbox), its `Files`, code
 * `Context`s and `BackgroundExec`s. Only the platform's `fetch`, streams and text codecs.
 */

import { CordonError, errorFrom, errorFromText, retryAfterSecs, type ErrorBody } from "./errors.js";
import type {
  ArchiveReport, AuditEvent, CellEvent, CellResult, ContextInfo, ContextLang, Destroyed, Duration, ExecInfo,
  ExecEvent, ExecOptions, ExecResult, FileDone, FileEntry, FileWritten, Health, Jwks, Lang, Listing,
  MetricSample, OidcConfiguration, PtySize,
  RunOptions, SandboxInfo, SandboxList, SandboxSpec, Snapshot, SnapshotStarts, StartOptions,
  StdinWritten, StreamEvent, TokenInfo,
  Volume, VolumeDeleted, VolumeList, VolumeMount,
} from "./models.js";

export const DEFAULT_URL = "http://127.0.0.1:7070";
/** A 429's Retry-After longer than this is not waited for: the error is thrown at once. */
export const MAX_RETRY_WAIT_SECS = 60;

type Fetch = typeof fetch;

export interface CordonOptions {
  /** default: CORDON_URL, else http://127.0.0.1:7070 */
  url?: string;
  /** default: CORDON_API_KEY */
  apiKey?: string;
  /** bounds each call (ms; for a stream, until its head arrives); default 120 000 */
  timeoutMs?: number;
  /** how many times a 429 with Retry-After is sent again after that wait; default 1 */
  retries?: number;
  /** a fetch of your own (a proxy agent, a test's counter); default the platform's */
  fetch?: Fetch;
}

/** A request body: text, bytes, a Blob, or a stream of bytes (sent as it is read). */
export type Body = string | Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;

/** A command: code in `opts.lang` (a string; sh when none) or an argv (an array). */
export type Command = string | readonly string[];

export interface Call {
  method: string;
  path: string;
  query?: [string, string][];
  json?: unknown;
  body?: Body;
  contentType?: string;
  accept?: string;
  signal?: AbortSignal;
  /** a stream: the timeout bounds the wait for its head, not how long it runs */
  stream?: boolean;
}

function env(name: string): string | undefined {
  const proc = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  return proc?.env?.[name];
}

const enc = encodeURIComponent;

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function replayable(body: Body | undefined): boolean {
  return body === undefined || typeof body === "string" || body instanceof Uint8Array ||
    body instanceof ArrayBuffer || body instanceof Blob;
}

function toStream(it: AsyncIterable<Uint8Array>): ReadableStream<Uint8Array> {
  const iter = it[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const { value, done } = await iter.next();
      if (done) controller.close();
      else controller.enqueue(value);
    },
    async cancel() {
      await iter.return?.();
    },
  });
}

function base64(data: string | Uint8Array): string {
  const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(bin);
}

/** Drops the fields that were not given. */
function some<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

function command(code: Command, lang: Lang | undefined): Record<string, unknown> {
  if (typeof code === "string") return { lang: lang ?? "sh", code };
  if (lang !== undefined) throw new TypeError("lang applies to code given as a string, not to an argv");
  return { argv: [...code] };
}

function stdin(s: string | Uint8Array | undefined): Record<string, string> {
  if (s === undefined) return {};
  return typeof s === "string" ? { stdin: s } : { stdin_base64: base64(s) };
}

function execBody(code: Command, opts: ExecOptions): Record<string, unknown> {
  return { ...command(code, opts.lang), ...stdin(opts.stdin), ...some({ timeout: opts.timeout, env: opts.env, cwd: opts.cwd }) };
}

function volumeMount(v: string | VolumeMount): VolumeMount {
  if (typeof v !== "string") return v;
  const i = v.indexOf(":");
  const name = v.slice(0, i);
  let path = v.slice(i + 1);
  let readOnly = false;
  if (path.endsWith(":ro") || path.endsWith(":rw")) {
    readOnly = path.endsWith(":ro");
    path = path.slice(0, -3);
  }
  return { name, path, read_only: readOnly };
}

function spec(s: SandboxSpec): Record<string, unknown> {
  return some({ ...s, volumes: s.volumes?.map(volumeMount) });
}

/** Reads an NDJSON stream of events; an `error` event throws its error. */
async function* events<E extends StreamEvent>(resp: Response): AsyncGenerator<E> {
  if (!resp.body) return;
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (value) buf += value;
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (line) yield event(line) as E;
      }
      if (done) break;
    }
    if (buf.trim()) yield event(buf.trim()) as E;
  } finally {
    await reader.cancel().catch(() => undefined);
  }
}

function event(line: string): StreamEvent {
  const ev = JSON.parse(line) as { type: string; error?: ErrorBody } & Record<string, unknown>;
  if (ev.type === "error" && ev.error) throw errorFrom(500, ev.error);
  return ev as unknown as StreamEvent;
}

/** A Cordon server. */
export class Cordon {
  readonly url: string;
  readonly #key: string;
  readonly #timeoutMs: number;
  readonly #retries: number;
  readonly #fetch: Fetch;

  constructor(opts: CordonOptions = {}) {
    this.url = (opts.url ?? env("CORDON_URL") ?? DEFAULT_URL).replace(/\/+$/, "");
    const key = opts.apiKey ?? env("CORDON_API_KEY");
    if (!key) {
      throw new TypeError("no API key: pass apiKey or set CORDON_API_KEY (the operator makes one with `cordon serve --new-key TENANT`)");
    }
    this.#key = key;
    this.#timeoutMs = opts.timeoutMs ?? 120_000;
    this.#retries = opts.retries ?? 1;
    this.#fetch = opts.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** Sends `call` (a route, its query and body); the answer is a success, errors are thrown. */
  async send(call: Call): Promise<Response> {
    let tries = this.#retries;
    for (;;) {
      const url = new URL(this.url + call.path);
      for (const [k, v] of call.query ?? []) url.searchParams.append(k, v);
      const headers: Record<string, string> = { authorization: `Bearer ${this.#key}` };
      let body: BodyInit | undefined;
      if (call.json !== undefined) {
        headers["content-type"] = "application/json";
        body = JSON.stringify(call.json);
      } else if (call.body !== undefined) {
        headers["content-type"] = call.contentType ?? "application/octet-stream";
        const b = call.body;
        body = (typeof b === "string" || b instanceof Uint8Array || b instanceof ArrayBuffer ||
          b instanceof Blob || b instanceof ReadableStream) ? b as BodyInit : toStream(b);
      }
      if (call.accept) headers.accept = call.accept;
      const timeout = new AbortController();
      const timer = setTimeout(() => timeout.abort(new DOMException("the call took longer than timeoutMs", "TimeoutError")), this.#timeoutMs);
      (timer as { unref?: () => void }).unref?.();
      const signal = call.signal ? AbortSignal.any([call.signal, timeout.signal]) : timeout.signal;
      const init: RequestInit & { duplex?: "half" } = { method: call.method, headers, body, signal };
      if (body instanceof ReadableStream) init.duplex = "half";
      const resp = await this.#fetch(url, init);
      if (call.stream) clearTimeout(timer);
      if (resp.ok) return resp;
      const wait = retryAfterSecs(resp.headers.get("retry-after"));
      const text = await resp.text();
      if (resp.status === 429 && tries > 0 && wait !== undefined && wait <= MAX_RETRY_WAIT_SECS &&
        replayable(call.body)) {
        tries -= 1;
        await sleep(wait * 1000);
        continue;
      }
      throw errorFromText(resp.status, text, resp.headers.get("retry-after"));
    }
  }

  /** Sends `call` and reads its JSON answer. */
  async json<T>(call: Call): Promise<T> {
    return (await (await this.send(call)).json()) as T;
  }

  /** Sends `call` and yields its NDJSON events. */
  async *events<E extends StreamEvent = StreamEvent>(call: Call): AsyncGenerator<E> {
    yield* events<E>(await this.send({ ...call, accept: "application/x-ndjson", stream: true }));
  }

  /** Any route of the API (docs/openapi.json), for one this client does not wrap. */
  request<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
    return this.json<T>({ method, path, json: body });
  }

  /** The server's health; its tiers, pools and counts come with a valid key. */
  health(): Promise<Health> {
    return this.json({ method: "GET", path: "/v1/health" });
  }

  /** The server's Prometheus metrics (OpenMetrics text). */
  async metrics(): Promise<string> {
    return (await this.send({ method: "GET", path: "/metrics" })).text();
  }

  #runBody(code: Command, opts: RunOptions, stream: boolean): Record<string, unknown> {
    const { lang, timeout, stdin: input, env: vars, signal: _signal, files, ...rest } = opts;
    void _signal;
    return {
      ...spec(rest),
      ...execBody(code, { lang: typeof code === "string" ? (lang ?? "python") : lang, timeout, stdin: input, env: vars }),
      ...(files ? { files: Object.entries(files).map(([path, data]) => ({ path, content_base64: base64(data) })) } : {}),
      ...(stream ? { stream: true } : {}),
    };
  }

  /**
   * Runs code once in a fresh sandbox that is destroyed afterwards. A string is code in
   * `opts.lang` (default python), an array an argv. With `trust` and `autonomy` the
   * server's tier policy picks the tier (`tier: "auto"` or none) or checks the one named.
   */
  run(code: Command, opts: RunOptions = {}): Promise<ExecResult> {
    return this.json({ method: "POST", path: "/v1/run", json: this.#runBody(code, opts, false), signal: opts.signal });
  }

  /** Like `run`, yielding stdout/stderr events as they come, then the outcome. */
  runStream(code: Command, opts: RunOptions = {}): AsyncGenerator<ExecEvent> {
    return this.events<ExecEvent>({ method: "POST", path: "/v1/run", json: this.#runBody(code, opts, true), signal: opts.signal });
  }

  /** Creates a sandbox; `destroy()` it when done (or use `withSandbox`). */
  async createSandbox(s: SandboxSpec = {}): Promise<Sandbox> {
    return new Sandbox(this, await this.json<SandboxInfo>({ method: "POST", path: "/v1/sandboxes", json: spec(s) }));
  }

  /** Creates a sandbox, passes it to `fn` and destroys it afterwards, whatever `fn` does. */
  async withSandbox<T>(s: SandboxSpec, fn: (sb: Sandbox) => Promise<T>): Promise<T> {
    const sb = await this.createSandbox(s);
    try {
      return await fn(sb);
    } finally {
      await sb.destroy();
    }
  }

  /** A sandbox of yours by its id, with its current state. */
  async getSandbox(id: string): Promise<Sandbox> {
    return new Sandbox(this, await this.json<SandboxInfo>({ method: "GET", path: `/v1/sandboxes/${enc(id)}` }));
  }

  /** A handle on sandbox `id` without asking the server; its calls throw NotFound if it is not yours. */
  sandboxHandle(id: string): Sandbox {
    return new Sandbox(this, { id } as SandboxInfo);
  }

  /** Your sandboxes; with `labels`, only those carrying every one. */
  async listSandboxes(labels: Record<string, string> = {}): Promise<SandboxInfo[]> {
    return (await this.sandboxes(labels)).sandboxes;
  }

  /** Your sandboxes and the bytes those paused to disk hold. */
  sandboxes(labels: Record<string, string> = {}): Promise<SandboxList> {
    return this.json({ method: "GET", path: "/v1/sandboxes", query: Object.entries(labels).map(([k, v]) => ["label", `${k}=${v}`]) });
  }

  /** Your snapshots, oldest first. */
  async snapshots(): Promise<Snapshot[]> {
    return (await this.json<{ snapshots: Snapshot[] }>({ method: "GET", path: "/v1/snapshots" })).snapshots;
  }

  /** One of your snapshots, by id or name. */
  snapshot(key: string): Promise<Snapshot> {
    return this.json({ method: "GET", path: `/v1/snapshots/${enc(key)}` });
  }

  /** Deletes a snapshot (by id or name) and its image; sandboxes started from it live on. */
  async deleteSnapshot(key: string): Promise<void> {
    await this.json({ method: "DELETE", path: `/v1/snapshots/${enc(key)}` });
  }

  /**
   * Starts `count` (1 to 20) sandboxes from snapshot `key` (id or name), each a create
   * through the server's gate with the snapshot's spec: one entry per sandbox asked for,
   * the sandbox or why it did not start.
   */
  async startFromSnapshot(key: string, count = 1, opts: StartOptions = {}): Promise<(Sandbox | CordonError)[]> {
    const got = await this.json<SnapshotStarts>({ method: "POST", path: `/v1/snapshots/${enc(key)}/sandboxes`, json: some({ count, ...opts }) });
    return starts(this, got);
  }

  /** Creates a volume: an empty file system of `size` bytes (or "256M"), its quota. */
  createVolume(name: string, size: number | string): Promise<Volume> {
    return this.json({ method: "POST", path: "/v1/volumes", json: { name, size } });
  }

  volumes(): Promise<VolumeList> {
    return this.json({ method: "GET", path: "/v1/volumes" });
  }

  volume(name: string): Promise<Volume> {
    return this.json({ method: "GET", path: `/v1/volumes/${enc(name)}` });
  }

  /** Deletes a volume and its contents; refused while a sandbox mounts it. */
  deleteVolume(name: string): Promise<VolumeDeleted> {
    return this.json({ method: "DELETE", path: `/v1/volumes/${enc(name)}` });
  }

  /** Your audit rows, oldest first (`after_id` pages on; at most 1000 a call). */
  async audit(q: { sandbox?: string; kind?: string; after_id?: number; since_ms?: number; limit?: number } = {}): Promise<AuditEvent[]> {
    const query = Object.entries(some(q)).map(([k, v]) => [k, String(v)] as [string, string]);
    return (await this.json<{ events: AuditEvent[] }>({ method: "GET", path: "/v1/audit", query })).events;
  }

  /** Whether a token this server minted for a sandbox is active, and its claims. */
  introspectToken(token: string): Promise<TokenInfo> {
    return this.json({ method: "POST", path: "/v1/tokens/introspect", json: { token } });
  }

  /** The OIDC discovery document of the tokens the server mints for sandboxes. */
  openidConfiguration(): Promise<OidcConfiguration> {
    return this.json({ method: "GET", path: "/.well-known/openid-configuration" });
  }

  /** The public keys minted tokens verify with. */
  jwks(): Promise<Jwks> {
    return this.json({ method: "GET", path: "/.well-known/jwks.json" });
  }
}

/** A sandbox's /work: list, stat, remove, rename, mkdir, directories as tar streams. */
export class Files {
  readonly #sb: Sandbox;

  constructor(sb: Sandbox) {
    this.#sb = sb;
  }

  #call(method: string, route: string, query: [string, string][] = [], json?: unknown): Call {
    return { method, path: `/v1/sandboxes/${enc(this.#sb.id)}/${route}`, query, json };
  }

  /** The entries of a directory, sorted by name. */
  async list(path = "/work"): Promise<FileEntry[]> {
    return (await this.listing(path)).entries;
  }

  /** The listing, with `truncated` for a directory of more than 10,000 entries. */
  listing(path = "/work"): Promise<Listing> {
    return this.#sb.client.json(this.#call("GET", "files", [["path", path]]));
  }

  /** One entry; a symlink is reported as one. */
  stat(path: string): Promise<FileEntry> {
    return this.#sb.client.json(this.#call("GET", "files/stat", [["path", path]]));
  }

  /** Removes a file, a symlink or an empty directory (any directory with `recursive`). */
  remove(path: string, opts: { recursive?: boolean } = {}): Promise<FileDone> {
    return this.#sb.client.json(this.#call("DELETE", "files", [["path", path], ["recursive", String(!!opts.recursive)]]));
  }

  /** Renames or moves `from` to `to` (a file at `to` is replaced). */
  rename(from: string, to: string): Promise<FileDone> {
    return this.#sb.client.json(this.#call("POST", "files/rename", [], { from, to }));
  }

  /** Makes a directory (with `parents`, missing parents too and no error if it exists). */
  mkdir(path: string, opts: { parents?: boolean } = {}): Promise<FileDone> {
    return this.#sb.client.json(this.#call("POST", "files/mkdir", [], { path, parents: !!opts.parents }));
  }

  /** Extracts an uncompressed tar (bytes, a Blob or a stream, sent as it is read) into `path`. */
  uploadArchive(tar: Body, path = "/work"): Promise<ArchiveReport> {
    return this.#sb.client.json({ ...this.#call("PUT", "archive", [["path", path]]), body: tar, contentType: "application/x-tar" });
  }

  /** The directory `path` as a tar stream, read as the sandbox writes it. */
  async downloadArchive(path: string): Promise<ReadableStream<Uint8Array>> {
    return bodyOf(await this.#sb.client.send({ ...this.#call("GET", "archive", [["path", path]]), stream: true }));
  }
}

function bodyOf(resp: Response): ReadableStream<Uint8Array> {
  return resp.body ?? new ReadableStream({ start: (c) => c.close() });
}

/** A live sandbox. */
export class Sandbox {
  readonly client: Cordon;
  readonly id: string;
  info: SandboxInfo;
  readonly files: Files;
  readonly #defaults = new Map<string, Context>();

  constructor(client: Cordon, info: SandboxInfo) {
    this.client = client;
    this.info = info;
    this.id = info.id;
    this.files = new Files(this);
  }

  #path(rest = ""): string {
    return `/v1/sandboxes/${enc(this.id)}${rest}`;
  }

  #file(path: string): string {
    return this.#path("/files/" + path.replace(/^\/+/, "").split("/").map(enc).join("/"));
  }

  /** Writes a file under /work: text, bytes, a Blob, or a stream of bytes (sent as it is read). */
  writeFile(path: string, data: Body, opts: { mode?: number } = {}): Promise<FileWritten> {
    return this.client.json({ method: "PUT", path: this.#file(path), query: [["mode", (opts.mode ?? 0o644).toString(8)]], body: data });
  }

  /** Reads a file under /work. */
  async readFile(path: string): Promise<Uint8Array> {
    return new Uint8Array(await (await this.client.send({ method: "GET", path: this.#file(path) })).arrayBuffer());
  }

  /** Reads a file under /work as text (UTF-8). */
  async readText(path: string): Promise<string> {
    return new TextDecoder().decode(await this.readFile(path));
  }

  /** A file under /work as a stream, read as it arrives. */
  async readFileStream(path: string): Promise<ReadableStream<Uint8Array>> {
    return bodyOf(await this.client.send({ method: "GET", path: this.#file(path), stream: true }));
  }

  /** Runs a shell command (a string), code in `opts.lang`, or an argv (an array); waits for it. */
  exec(code: Command, opts: ExecOptions = {}): Promise<ExecResult> {
    return this.client.json({ method: "POST", path: this.#path("/exec"), json: execBody(code, opts), signal: opts.signal });
  }

  /** Like `exec`, yielding stdout/stderr events as they come, then the outcome. */
  execStream(code: Command, opts: ExecOptions = {}): AsyncGenerator<ExecEvent> {
    return this.client.events<ExecEvent>({ method: "POST", path: this.#path("/exec"), json: execBody(code, opts), signal: opts.signal });
  }

  /**
   * Starts a command in the background and returns its handle at once; `pty` runs it on a
   * pseudo-terminal of that size (all its output is stdout; closing its stdin sends ^D).
   */
  async execBackground(code: Command, opts: Omit<ExecOptions, "stdin"> & { pty?: PtySize } = {}): Promise<BackgroundExec> {
    const json = { ...execBody(code, opts), background: true, ...(opts.pty ? { pty: opts.pty } : {}) };
    return new BackgroundExec(this, await this.client.json<ExecInfo>({ method: "POST", path: this.#path("/exec"), json }));
  }

  /** The sandbox's background execs, running or ended, oldest first. */
  async execs(): Promise<BackgroundExec[]> {
    const { execs } = await this.client.json<{ execs: ExecInfo[] }>({ method: "GET", path: this.#path("/execs") });
    return execs.map((e) => new BackgroundExec(this, e));
  }

  /** The handle of background exec `id`. */
  execHandle(id: string): BackgroundExec {
    return new BackgroundExec(this, { id } as ExecInfo);
  }

  /** Reads its current state into `info`. */
  async refresh(): Promise<SandboxInfo> {
    return (this.info = await this.client.json({ method: "GET", path: this.#path() }));
  }

  /**
   * Its CPU, memory and disk figures over time, oldest first: the samples taken from
   * `start_ms` to `end_ms` (milliseconds since the Unix epoch; each optional), one every 5 s,
   * the last hour kept.
   */
  async metrics(opts: { start_ms?: number; end_ms?: number } = {}): Promise<MetricSample[]> {
    const query = Object.entries(some(opts)).map(([k, v]) => [k, String(v)] as [string, string]);
    return (await this.client.json<{ samples: MetricSample[] }>({ method: "GET", path: this.#path("/metrics"), query })).samples;
  }

  /**
   * Stops its processes where they are; `toDisk` (microvm) saves it to disk and frees its memory;
   * `filesOnly` (container, gvisor) keeps its files only, and `resume()` starts it again from them.
   */
  async pause(opts: { toDisk?: boolean; filesOnly?: boolean } = {}): Promise<SandboxInfo> {
    const json: { to_disk?: boolean; files_only?: boolean } = {};
    if (opts.toDisk) json.to_disk = true;
    if (opts.filesOnly) json.files_only = true;
    return (this.info = await this.client.json({ method: "POST", path: this.#path("/pause"), json }));
  }

  async resume(): Promise<SandboxInfo> {
    return (this.info = await this.client.json({ method: "POST", path: this.#path("/resume"), json: {} }));
  }

  /**
   * Takes a snapshot of this sandbox, kept until you delete it: `mode` "full" (memory,
   * processes, files, where the tier can) or "filesystem" (files; processes start fresh);
   * left out, the most its tier keeps. The sandbox runs on.
   */
  createSnapshot(opts: { name?: string; mode?: "full" | "filesystem" } = {}): Promise<Snapshot> {
    return this.client.json({ method: "POST", path: this.#path("/snapshots"), json: some(opts) });
  }

  /** `count` (1 to 20) new sandboxes from a snapshot of this one taken now (then deleted). */
  async fork(count = 1, opts: StartOptions = {}): Promise<(Sandbox | CordonError)[]> {
    const got = await this.client.json<SnapshotStarts>({ method: "POST", path: this.#path("/fork"), json: some({ count, ...opts }) });
    return starts(this.client, got);
  }

  /** Changes its TTL (from its creation) or idle timeout, within the server's maxima. */
  async update(opts: { ttl?: Duration; idle_timeout?: Duration }): Promise<SandboxInfo> {
    return (this.info = await this.client.json({ method: "PATCH", path: this.#path(), json: some(opts) }));
  }

  /** Destroys the sandbox; calling it again is fine (`already` is then true). */
  destroy(): Promise<Destroyed> {
    return this.client.json({ method: "DELETE", path: this.#path() });
  }

  /** Starts a long-lived interpreter whose state persists from one cell to the next. */
  async createContext(lang: ContextLang = "python"): Promise<Context> {
    return new Context(this, await this.client.json<ContextInfo>({ method: "POST", path: this.#path("/contexts"), json: { lang } }));
  }

  async contexts(): Promise<Context[]> {
    const { contexts } = await this.client.json<{ contexts: ContextInfo[] }>({ method: "GET", path: this.#path("/contexts") });
    return contexts.map((c) => new Context(this, c));
  }

  /** The sandbox's default context of `lang` (made at its first use). */
  async defaultContext(lang: ContextLang = "python"): Promise<Context> {
    let c = this.#defaults.get(lang);
    if (!c) {
      c = new Context(this, await this.client.json<ContextInfo>({ method: "POST", path: this.#path("/contexts"), json: { lang, default: true } }));
      this.#defaults.set(lang, c);
    }
    return c;
  }

  /** Runs a cell in `opts.context` (default: the sandbox's default context of `opts.lang`). */
  async runCode(code: string, opts: { context?: Context; lang?: ContextLang; timeout?: Duration; onStdout?: (s: string) => void; onStderr?: (s: string) => void } = {}): Promise<CellResult> {
    const ctx = opts.context ?? (await this.defaultContext(opts.lang));
    return ctx.run(code, opts);
  }

  /** @internal */
  forgetContext(id: string): void {
    for (const [k, v] of this.#defaults) if (v.id === id) this.#defaults.delete(k);
  }
}

/** A code context: a long-lived interpreter in a sandbox. */
export class Context {
  readonly sandbox: Sandbox;
  readonly id: string;
  info: ContextInfo;

  constructor(sandbox: Sandbox, info: ContextInfo) {
    this.sandbox = sandbox;
    this.info = info;
    this.id = info.id;
  }

  #path(rest = ""): string {
    return `/v1/sandboxes/${enc(this.sandbox.id)}/contexts/${enc(this.id)}${rest}`;
  }

  /** Runs one cell; `onStdout`/`onStderr` receive its output as it comes. */
  async run(code: string, opts: { timeout?: Duration; onStdout?: (s: string) => void; onStderr?: (s: string) => void } = {}): Promise<CellResult> {
    if (!opts.onStdout && !opts.onStderr) {
      return this.sandbox.client.json({ method: "POST", path: this.#path("/run"), json: some({ code, timeout: opts.timeout }) });
    }
    for await (const ev of this.runStream(code, opts)) {
      if (ev.type === "stdout") opts.onStdout?.(ev.data);
      else if (ev.type === "stderr") opts.onStderr?.(ev.data);
      else if (ev.type === "result") return ev.result;
    }
    throw new CordonError(500, { code: "internal", message: "the stream ended without the cell's result" });
  }

  /** Runs one cell, yielding stdout/stderr events as they come, then a result event. */
  runStream(code: string, opts: { timeout?: Duration } = {}): AsyncGenerator<CellEvent> {
    return this.sandbox.client.events<CellEvent>({ method: "POST", path: this.#path("/run"), json: some({ code, timeout: opts.timeout }) });
  }

  /** Starts its interpreter again: every variable and import is gone. */
  async restart(): Promise<ContextInfo> {
    return (this.info = await this.sandbox.client.json({ method: "POST", path: this.#path("/restart"), json: {} }));
  }

  /** Ends the context (its interpreter is killed). */
  async close(): Promise<ContextInfo> {
    this.info = await this.sandbox.client.json({ method: "DELETE", path: this.#path() });
    this.sandbox.forgetContext(this.id);
    return this.info;
  }
}

/** A background exec: attach to its output (`for await`), write its stdin, stop it. */
export class BackgroundExec {
  readonly sandbox: Sandbox;
  readonly id: string;
  info: ExecInfo;

  constructor(sandbox: Sandbox, info: ExecInfo) {
    this.sandbox = sandbox;
    this.info = info;
    this.id = info.id;
  }

  #path(rest = ""): string {
    return `/v1/sandboxes/${enc(this.sandbox.id)}/execs/${enc(this.id)}${rest}`;
  }

  /** Attaches: the output kept since its start, live output, then the outcome event. */
  output(): AsyncGenerator<ExecEvent> {
    return this.sandbox.client.events<ExecEvent>({ method: "GET", path: this.#path() });
  }

  [Symbol.asyncIterator](): AsyncGenerator<ExecEvent> {
    return this.output();
  }

  /** Waits for its end; its stdout and stderr are what the sandbox kept. */
  wait(): Promise<ExecResult> {
    return this.sandbox.client.json({ method: "GET", path: this.#path(), query: [["stream", "false"]] });
  }

  /** Writes to its stdin; `close` ends the stdin after these bytes. */
  sendStdin(data: string | Uint8Array, opts: { close?: boolean } = {}): Promise<StdinWritten> {
    const json = { ...(typeof data === "string" ? { data } : { data_base64: base64(data) }), close: !!opts.close };
    return this.sandbox.client.json({ method: "POST", path: this.#path("/stdin"), json });
  }

  /** Sets its pseudo-terminal's size; an exec without one throws Unsupported. */
  async resize(size: PtySize): Promise<ExecInfo> {
    return (this.info = await this.sandbox.client.json({ method: "POST", path: this.#path("/resize"), json: size }));
  }

  /** SIGTERM to its process tree, SIGKILL after the server's grace (`force`: at once). */
  kill(opts: { force?: boolean } = {}): Promise<ExecInfo> {
    return this.sandbox.client.json({ method: "DELETE", path: this.#path(), query: opts.force ? [["signal", "kill"]] : [] });
  }

  /** Its entry in the sandbox's list. */
  async status(): Promise<ExecInfo> {
    const { execs } = await this.sandbox.client.json<{ execs: ExecInfo[] }>({ method: "GET", path: `/v1/sandboxes/${enc(this.sandbox.id)}/execs` });
    const e = execs.find((x) => x.id === this.id);
    if (!e) throw errorFrom(404, { code: "not_found", message: `no background exec ${this.id}`, fix: "list the sandbox's execs with execs()" });
    return e;
  }
}

function starts(client: Cordon, got: SnapshotStarts): (Sandbox | CordonError)[] {
  const out: (Sandbox | CordonError)[] = got.sandboxes.map((info) => new Sandbox(client, info));
  for (const e of got.errors ?? []) out.push(errorFrom(0, e));
  return out;
}
