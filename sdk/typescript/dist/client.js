/**
 * The client: `Cordon` (the service), `Sandbox` (one live sandbox), its `Files`, code
 * `Context`s and `BackgroundExec`s. Only the platform's `fetch`, streams and text codecs.
 */
import { CordonError, errorFrom, errorFromText, retryAfterSecs } from "./errors.js";
export const DEFAULT_URL = "http://127.0.0.1:7070";
/** A 429's Retry-After longer than this is not waited for: the error is thrown at once. */
export const MAX_RETRY_WAIT_SECS = 60;
function env(name) {
    const proc = globalThis.process;
    return proc?.env?.[name];
}
const enc = encodeURIComponent;
function sleep(ms) {
    return new Promise((resolve) => setTimeout(resolve, ms));
}
function replayable(body) {
    return body === undefined || typeof body === "string" || body instanceof Uint8Array ||
        body instanceof ArrayBuffer || body instanceof Blob;
}
function toStream(it) {
    const iter = it[Symbol.asyncIterator]();
    return new ReadableStream({
        async pull(controller) {
            const { value, done } = await iter.next();
            if (done)
                controller.close();
            else
                controller.enqueue(value);
        },
        async cancel() {
            await iter.return?.();
        },
    });
}
function base64(data) {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    let bin = "";
    for (let i = 0; i < bytes.length; i += 0x8000) {
        bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
    }
    return btoa(bin);
}
/** Drops the fields that were not given. */
function some(o) {
    return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));
}
function command(code, lang) {
    if (typeof code === "string")
        return { lang: lang ?? "sh", code };
    if (lang !== undefined)
        throw new TypeError("lang applies to code given as a string, not to an argv");
    return { argv: [...code] };
}
function stdin(s) {
    if (s === undefined)
        return {};
    return typeof s === "string" ? { stdin: s } : { stdin_base64: base64(s) };
}
function execBody(code, opts) {
    return { ...command(code, opts.lang), ...stdin(opts.stdin), ...some({ timeout: opts.timeout, env: opts.env, cwd: opts.cwd }) };
}
function volumeMount(v) {
    if (typeof v !== "string")
        return v;
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
function spec(s) {
    return some({ ...s, volumes: s.volumes?.map(volumeMount) });
}
/** Reads an NDJSON stream of events; an `error` event throws its error. */
async function* events(resp) {
    if (!resp.body)
        return;
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    try {
        for (;;) {
            const { value, done } = await reader.read();
            if (value)
                buf += value;
            let nl;
            while ((nl = buf.indexOf("\n")) >= 0) {
                const line = buf.slice(0, nl).trim();
                buf = buf.slice(nl + 1);
                if (line)
                    yield event(line);
            }
            if (done)
                break;
        }
        if (buf.trim())
            yield event(buf.trim());
    }
    finally {
        await reader.cancel().catch(() => undefined);
    }
}
function event(line) {
    const ev = JSON.parse(line);
    if (ev.type === "error" && ev.error)
        throw errorFrom(500, ev.error);
    return ev;
}
/** A Cordon server. */
export class Cordon {
    url;
    #key;
    #timeoutMs;
    #retries;
    #fetch;
    constructor(opts = {}) {
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
    async send(call) {
        let tries = this.#retries;
        for (;;) {
            const url = new URL(this.url + call.path);
            for (const [k, v] of call.query ?? [])
                url.searchParams.append(k, v);
            const headers = { authorization: `Bearer ${this.#key}` };
            let body;
            if (call.json !== undefined) {
                headers["content-type"] = "application/json";
                body = JSON.stringify(call.json);
            }
            else if (call.body !== undefined) {
                headers["content-type"] = call.contentType ?? "application/octet-stream";
                const b = call.body;
                body = (typeof b === "string" || b instanceof Uint8Array || b instanceof ArrayBuffer ||
                    b instanceof Blob || b instanceof ReadableStream) ? b : toStream(b);
            }
            if (call.accept)
                headers.accept = call.accept;
            const timeout = new AbortController();
            const timer = setTimeout(() => timeout.abort(new DOMException("the call took longer than timeoutMs", "TimeoutError")), this.#timeoutMs);
            timer.unref?.();
            const signal = call.signal ? AbortSignal.any([call.signal, timeout.signal]) : timeout.signal;
            const init = { method: call.method, headers, body, signal };
            if (body instanceof ReadableStream)
                init.duplex = "half";
            const resp = await this.#fetch(url, init);
            if (call.stream)
                clearTimeout(timer);
            if (resp.ok)
                return resp;
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
    async json(call) {
        return (await (await this.send(call)).json());
    }
    /** Sends `call` and yields its NDJSON events. */
    async *events(call) {
        yield* events(await this.send({ ...call, accept: "application/x-ndjson", stream: true }));
    }
    /** Any route of the API (docs/openapi.json), for one this client does not wrap. */
    request(method, path, body) {
        return this.json({ method, path, json: body });
    }
    /** The server's health; its tiers, pools and counts come with a valid key. */
    health() {
        return this.json({ method: "GET", path: "/v1/health" });
    }
    /** The server's Prometheus metrics (OpenMetrics text). */
    async metrics() {
        return (await this.send({ method: "GET", path: "/metrics" })).text();
    }
    #runBody(code, opts, stream) {
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
    run(code, opts = {}) {
        return this.json({ method: "POST", path: "/v1/run", json: this.#runBody(code, opts, false), signal: opts.signal });
    }
    /** Like `run`, yielding stdout/stderr events as they come, then the outcome. */
    runStream(code, opts = {}) {
        return this.events({ method: "POST", path: "/v1/run", json: this.#runBody(code, opts, true), signal: opts.signal });
    }
    /** Creates a sandbox; `destroy()` it when done (or use `withSandbox`). */
    async createSandbox(s = {}) {
        return new Sandbox(this, await this.json({ method: "POST", path: "/v1/sandboxes", json: spec(s) }));
    }
    /** Creates a sandbox, passes it to `fn` and destroys it afterwards, whatever `fn` does. */
    async withSandbox(s, fn) {
        const sb = await this.createSandbox(s);
        try {
            return await fn(sb);
        }
        finally {
            await sb.destroy();
        }
    }
    /** A sandbox of yours by its id, with its current state. */
    async getSandbox(id) {
        return new Sandbox(this, await this.json({ method: "GET", path: `/v1/sandboxes/${enc(id)}` }));
    }
    /** A handle on sandbox `id` without asking the server; its calls throw NotFound if it is not yours. */
    sandboxHandle(id) {
        return new Sandbox(this, { id });
    }
    /** Your sandboxes; with `labels`, only those carrying every one. */
    async listSandboxes(labels = {}) {
        return (await this.sandboxes(labels)).sandboxes;
    }
    /** Your sandboxes and the bytes those paused to disk hold. */
    sandboxes(labels = {}) {
        return this.json({ method: "GET", path: "/v1/sandboxes", query: Object.entries(labels).map(([k, v]) => ["label", `${k}=${v}`]) });
    }
    /** Your snapshots, oldest first. */
    async snapshots() {
        return (await this.json({ method: "GET", path: "/v1/snapshots" })).snapshots;
    }
    /** One of your snapshots, by id or name. */
    snapshot(key) {
        return this.json({ method: "GET", path: `/v1/snapshots/${enc(key)}` });
    }
    /** Deletes a snapshot (by id or name) and its image; sandboxes started from it live on. */
    async deleteSnapshot(key) {
        await this.json({ method: "DELETE", path: `/v1/snapshots/${enc(key)}` });
    }
    /**
     * Starts `count` (1 to 20) sandboxes from snapshot `key` (id or name), each a create
     * through the server's gate with the snapshot's spec: one entry per sandbox asked for,
     * the sandbox or why it did not start.
     */
    async startFromSnapshot(key, count = 1, opts = {}) {
        const got = await this.json({ method: "POST", path: `/v1/snapshots/${enc(key)}/sandboxes`, json: some({ count, ...opts }) });
        return starts(this, got);
    }
    /** Creates a volume: an empty file system of `size` bytes (or "256M"), its quota. */
    createVolume(name, size) {
        return this.json({ method: "POST", path: "/v1/volumes", json: { name, size } });
    }
    volumes() {
        return this.json({ method: "GET", path: "/v1/volumes" });
    }
    volume(name) {
        return this.json({ method: "GET", path: `/v1/volumes/${enc(name)}` });
    }
    /** Deletes a volume and its contents; refused while a sandbox mounts it. */
    deleteVolume(name) {
        return this.json({ method: "DELETE", path: `/v1/volumes/${enc(name)}` });
    }
    /** Your audit rows, oldest first (`after_id` pages on; at most 1000 a call). */
    async audit(q = {}) {
        const query = Object.entries(some(q)).map(([k, v]) => [k, String(v)]);
        return (await this.json({ method: "GET", path: "/v1/audit", query })).events;
    }
    /** Whether a token this server minted for a sandbox is active, and its claims. */
    introspectToken(token) {
        return this.json({ method: "POST", path: "/v1/tokens/introspect", json: { token } });
    }
    /** The OIDC discovery document of the tokens the server mints for sandboxes. */
    openidConfiguration() {
        return this.json({ method: "GET", path: "/.well-known/openid-configuration" });
    }
    /** The public keys minted tokens verify with. */
    jwks() {
        return this.json({ method: "GET", path: "/.well-known/jwks.json" });
    }
}
/** A sandbox's /work: list, stat, remove, rename, mkdir, directories as tar streams. */
export class Files {
    #sb;
    constructor(sb) {
        this.#sb = sb;
    }
    #call(method, route, query = [], json) {
        return { method, path: `/v1/sandboxes/${enc(this.#sb.id)}/${route}`, query, json };
    }
    /** The entries of a directory, sorted by name. */
    async list(path = "/work") {
        return (await this.listing(path)).entries;
    }
    /** The listing, with `truncated` for a directory of more than 10,000 entries. */
    listing(path = "/work") {
        return this.#sb.client.json(this.#call("GET", "files", [["path", path]]));
    }
    /** One entry; a symlink is reported as one. */
    stat(path) {
        return this.#sb.client.json(this.#call("GET", "files/stat", [["path", path]]));
    }
    /** Removes a file, a symlink or an empty directory (any directory with `recursive`). */
    remove(path, opts = {}) {
        return this.#sb.client.json(this.#call("DELETE", "files", [["path", path], ["recursive", String(!!opts.recursive)]]));
    }
    /** Renames or moves `from` to `to` (a file at `to` is replaced). */
    rename(from, to) {
        return this.#sb.client.json(this.#call("POST", "files/rename", [], { from, to }));
    }
    /** Makes a directory (with `parents`, missing parents too and no error if it exists). */
    mkdir(path, opts = {}) {
        return this.#sb.client.json(this.#call("POST", "files/mkdir", [], { path, parents: !!opts.parents }));
    }
    /** Extracts an uncompressed tar (bytes, a Blob or a stream, sent as it is read) into `path`. */
    uploadArchive(tar, path = "/work") {
        return this.#sb.client.json({ ...this.#call("PUT", "archive", [["path", path]]), body: tar, contentType: "application/x-tar" });
    }
    /** The directory `path` as a tar stream, read as the sandbox writes it. */
    async downloadArchive(path) {
        return bodyOf(await this.#sb.client.send({ ...this.#call("GET", "archive", [["path", path]]), stream: true }));
    }
}
function bodyOf(resp) {
    return resp.body ?? new ReadableStream({ start: (c) => c.close() });
}
/** A live sandbox. */
export class Sandbox {
    client;
    id;
    info;
    files;
    #defaults = new Map();
    constructor(client, info) {
        this.client = client;
        this.info = info;
        this.id = info.id;
        this.files = new Files(this);
    }
    #path(rest = "") {
        return `/v1/sandboxes/${enc(this.id)}${rest}`;
    }
    #file(path) {
        return this.#path("/files/" + path.replace(/^\/+/, "").split("/").map(enc).join("/"));
    }
    /** Writes a file under /work: text, bytes, a Blob, or a stream of bytes (sent as it is read). */
    writeFile(path, data, opts = {}) {
        return this.client.json({ method: "PUT", path: this.#file(path), query: [["mode", (opts.mode ?? 0o644).toString(8)]], body: data });
    }
    /** Reads a file under /work. */
    async readFile(path) {
        return new Uint8Array(await (await this.client.send({ method: "GET", path: this.#file(path) })).arrayBuffer());
    }
    /** Reads a file under /work as text (UTF-8). */
    async readText(path) {
        return new TextDecoder().decode(await this.readFile(path));
    }
    /** A file under /work as a stream, read as it arrives. */
    async readFileStream(path) {
        return bodyOf(await this.client.send({ method: "GET", path: this.#file(path), stream: true }));
    }
    /** Runs a shell command (a string), code in `opts.lang`, or an argv (an array); waits for it. */
    exec(code, opts = {}) {
        return this.client.json({ method: "POST", path: this.#path("/exec"), json: execBody(code, opts), signal: opts.signal });
    }
    /** Like `exec`, yielding stdout/stderr events as they come, then the outcome. */
    execStream(code, opts = {}) {
        return this.client.events({ method: "POST", path: this.#path("/exec"), json: execBody(code, opts), signal: opts.signal });
    }
    /**
     * Starts a command in the background and returns its handle at once; `pty` runs it on a
     * pseudo-terminal of that size (all its output is stdout; closing its stdin sends ^D).
     */
    async execBackground(code, opts = {}) {
        const json = { ...execBody(code, opts), background: true, ...(opts.pty ? { pty: opts.pty } : {}) };
        return new BackgroundExec(this, await this.client.json({ method: "POST", path: this.#path("/exec"), json }));
    }
    /** The sandbox's background execs, running or ended, oldest first. */
    async execs() {
        const { execs } = await this.client.json({ method: "GET", path: this.#path("/execs") });
        return execs.map((e) => new BackgroundExec(this, e));
    }
    /** The handle of background exec `id`. */
    execHandle(id) {
        return new BackgroundExec(this, { id });
    }
    /** Reads its current state into `info`. */
    async refresh() {
        return (this.info = await this.client.json({ method: "GET", path: this.#path() }));
    }
    /**
     * Its CPU, memory and disk figures over time, oldest first: the samples taken from
     * `start_ms` to `end_ms` (milliseconds since the Unix epoch; each optional), one every 5 s,
     * the last hour kept.
     */
    async metrics(opts = {}) {
        const query = Object.entries(some(opts)).map(([k, v]) => [k, String(v)]);
        return (await this.client.json({ method: "GET", path: this.#path("/metrics"), query })).samples;
    }
    /**
     * Stops its processes where they are; `toDisk` (microvm) saves it to disk and frees its memory;
     * `filesOnly` (container, gvisor) keeps its files only, and `resume()` starts it again from them.
     */
    async pause(opts = {}) {
        const json = {};
        if (opts.toDisk)
            json.to_disk = true;
        if (opts.filesOnly)
            json.files_only = true;
        return (this.info = await this.client.json({ method: "POST", path: this.#path("/pause"), json }));
    }
    async resume() {
        return (this.info = await this.client.json({ method: "POST", path: this.#path("/resume"), json: {} }));
    }
    /**
     * Takes a snapshot of this sandbox, kept until you delete it: `mode` "full" (memory,
     * processes, files, where the tier can) or "filesystem" (files; processes start fresh);
     * left out, the most its tier keeps. The sandbox runs on.
     */
    createSnapshot(opts = {}) {
        return this.client.json({ method: "POST", path: this.#path("/snapshots"), json: some(opts) });
    }
    /** `count` (1 to 20) new sandboxes from a snapshot of this one taken now (then deleted). */
    async fork(count = 1, opts = {}) {
        const got = await this.client.json({ method: "POST", path: this.#path("/fork"), json: some({ count, ...opts }) });
        return starts(this.client, got);
    }
    /** Changes its TTL (from its creation) or idle timeout, within the server's maxima. */
    async update(opts) {
        return (this.info = await this.client.json({ method: "PATCH", path: this.#path(), json: some(opts) }));
    }
    /** Destroys the sandbox; calling it again is fine (`already` is then true). */
    destroy() {
        return this.client.json({ method: "DELETE", path: this.#path() });
    }
    /** Starts a long-lived interpreter whose state persists from one cell to the next. */
    async createContext(lang = "python") {
        return new Context(this, await this.client.json({ method: "POST", path: this.#path("/contexts"), json: { lang } }));
    }
    async contexts() {
        const { contexts } = await this.client.json({ method: "GET", path: this.#path("/contexts") });
        return contexts.map((c) => new Context(this, c));
    }
    /** The sandbox's default context of `lang` (made at its first use). */
    async defaultContext(lang = "python") {
        let c = this.#defaults.get(lang);
        if (!c) {
            c = new Context(this, await this.client.json({ method: "POST", path: this.#path("/contexts"), json: { lang, default: true } }));
            this.#defaults.set(lang, c);
        }
        return c;
    }
    /** Runs a cell in `opts.context` (default: the sandbox's default context of `opts.lang`). */
    async runCode(code, opts = {}) {
        const ctx = opts.context ?? (await this.defaultContext(opts.lang));
        return ctx.run(code, opts);
    }
    /** @internal */
    forgetContext(id) {
        for (const [k, v] of this.#defaults)
            if (v.id === id)
                this.#defaults.delete(k);
    }
}
/** A code context: a long-lived interpreter in a sandbox. */
export class Context {
    sandbox;
    id;
    info;
    constructor(sandbox, info) {
        this.sandbox = sandbox;
        this.info = info;
        this.id = info.id;
    }
    #path(rest = "") {
        return `/v1/sandboxes/${enc(this.sandbox.id)}/contexts/${enc(this.id)}${rest}`;
    }
    /** Runs one cell; `onStdout`/`onStderr` receive its output as it comes. */
    async run(code, opts = {}) {
        if (!opts.onStdout && !opts.onStderr) {
            return this.sandbox.client.json({ method: "POST", path: this.#path("/run"), json: some({ code, timeout: opts.timeout }) });
        }
        for await (const ev of this.runStream(code, opts)) {
            if (ev.type === "stdout")
                opts.onStdout?.(ev.data);
            else if (ev.type === "stderr")
                opts.onStderr?.(ev.data);
            else if (ev.type === "result")
                return ev.result;
        }
        throw new CordonError(500, { code: "internal", message: "the stream ended without the cell's result" });
    }
    /** Runs one cell, yielding stdout/stderr events as they come, then a result event. */
    runStream(code, opts = {}) {
        return this.sandbox.client.events({ method: "POST", path: this.#path("/run"), json: some({ code, timeout: opts.timeout }) });
    }
    /** Starts its interpreter again: every variable and import is gone. */
    async restart() {
        return (this.info = await this.sandbox.client.json({ method: "POST", path: this.#path("/restart"), json: {} }));
    }
    /** Ends the context (its interpreter is killed). */
    async close() {
        this.info = await this.sandbox.client.json({ method: "DELETE", path: this.#path() });
        this.sandbox.forgetContext(this.id);
        return this.info;
    }
}
/** A background exec: attach to its output (`for await`), write its stdin, stop it. */
export class BackgroundExec {
    sandbox;
    id;
    info;
    constructor(sandbox, info) {
        this.sandbox = sandbox;
        this.info = info;
        this.id = info.id;
    }
    #path(rest = "") {
        return `/v1/sandboxes/${enc(this.sandbox.id)}/execs/${enc(this.id)}${rest}`;
    }
    /** Attaches: the output kept since its start, live output, then the outcome event. */
    output() {
        return this.sandbox.client.events({ method: "GET", path: this.#path() });
    }
    [Symbol.asyncIterator]() {
        return this.output();
    }
    /** Waits for its end; its stdout and stderr are what the sandbox kept. */
    wait() {
        return this.sandbox.client.json({ method: "GET", path: this.#path(), query: [["stream", "false"]] });
    }
    /** Writes to its stdin; `close` ends the stdin after these bytes. */
    sendStdin(data, opts = {}) {
        const json = { ...(typeof data === "string" ? { data } : { data_base64: base64(data) }), close: !!opts.close };
        return this.sandbox.client.json({ method: "POST", path: this.#path("/stdin"), json });
    }
    /** Sets its pseudo-terminal's size; an exec without one throws Unsupported. */
    async resize(size) {
        return (this.info = await this.sandbox.client.json({ method: "POST", path: this.#path("/resize"), json: size }));
    }
    /** SIGTERM to its process tree, SIGKILL after the server's grace (`force`: at once). */
    kill(opts = {}) {
        return this.sandbox.client.json({ method: "DELETE", path: this.#path(), query: opts.force ? [["signal", "kill"]] : [] });
    }
    /** Its entry in the sandbox's list. */
    async status() {
        const { execs } = await this.sandbox.client.json({ method: "GET", path: `/v1/sandboxes/${enc(this.sandbox.id)}/execs` });
        const e = execs.find((x) => x.id === this.id);
        if (!e)
            throw errorFrom(404, { code: "not_found", message: `no background exec ${this.id}`, fix: "list the sandbox's execs with execs()" });
        return e;
    }
}
function starts(client, got) {
    const out = got.sandboxes.map((info) => new Sandbox(client, info));
    for (const e of got.errors ?? [])
        out.push(errorFrom(0, e));
    return out;
}
