/**
 * The client: `Cordon` (the service), `Sandbox` (one live sandbox), its `Files`, code
 * `Context`s and `BackgroundExec`s. Only the platform's `fetch`, streams and text codecs.
 */
import { CordonError } from "./errors.js";
import type { ArchiveReport, AuditEvent, CellEvent, CellResult, ContextInfo, ContextLang, Destroyed, Duration, ExecInfo, ExecEvent, ExecOptions, ExecResult, FileDone, FileEntry, FileWritten, Health, Jwks, Listing, MetricSample, OidcConfiguration, PtySize, RunOptions, SandboxInfo, SandboxList, SandboxSpec, Snapshot, StartOptions, StdinWritten, StreamEvent, TokenInfo, Volume, VolumeDeleted, VolumeList } from "./models.js";
export declare const DEFAULT_URL = "http://127.0.0.1:7070";
/** A 429's Retry-After longer than this is not waited for: the error is thrown at once. */
export declare const MAX_RETRY_WAIT_SECS = 60;
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
/** A Cordon server. */
export declare class Cordon {
    #private;
    readonly url: string;
    constructor(opts?: CordonOptions);
    /** Sends `call` (a route, its query and body); the answer is a success, errors are thrown. */
    send(call: Call): Promise<Response>;
    /** Sends `call` and reads its JSON answer. */
    json<T>(call: Call): Promise<T>;
    /** Sends `call` and yields its NDJSON events. */
    events<E extends StreamEvent = StreamEvent>(call: Call): AsyncGenerator<E>;
    /** Any route of the API (docs/openapi.json), for one this client does not wrap. */
    request<T = unknown>(method: string, path: string, body?: unknown): Promise<T>;
    /** The server's health; its tiers, pools and counts come with a valid key. */
    health(): Promise<Health>;
    /** The server's Prometheus metrics (OpenMetrics text). */
    metrics(): Promise<string>;
    /**
     * Runs code once in a fresh sandbox that is destroyed afterwards. A string is code in
     * `opts.lang` (default python), an array an argv. With `trust` and `autonomy` the
     * server's tier policy picks the tier (`tier: "auto"` or none) or checks the one named.
     */
    run(code: Command, opts?: RunOptions): Promise<ExecResult>;
    /** Like `run`, yielding stdout/stderr events as they come, then the outcome. */
    runStream(code: Command, opts?: RunOptions): AsyncGenerator<ExecEvent>;
    /** Creates a sandbox; `destroy()` it when done (or use `withSandbox`). */
    createSandbox(s?: SandboxSpec): Promise<Sandbox>;
    /** Creates a sandbox, passes it to `fn` and destroys it afterwards, whatever `fn` does. */
    withSandbox<T>(s: SandboxSpec, fn: (sb: Sandbox) => Promise<T>): Promise<T>;
    /** A sandbox of yours by its id, with its current state. */
    getSandbox(id: string): Promise<Sandbox>;
    /** A handle on sandbox `id` without asking the server; its calls throw NotFound if it is not yours. */
    sandboxHandle(id: string): Sandbox;
    /** Your sandboxes; with `labels`, only those carrying every one. */
    listSandboxes(labels?: Record<string, string>): Promise<SandboxInfo[]>;
    /** Your sandboxes and the bytes those paused to disk hold. */
    sandboxes(labels?: Record<string, string>): Promise<SandboxList>;
    /** Your snapshots, oldest first. */
    snapshots(): Promise<Snapshot[]>;
    /** One of your snapshots, by id or name. */
    snapshot(key: string): Promise<Snapshot>;
    /** Deletes a snapshot (by id or name) and its image; sandboxes started from it live on. */
    deleteSnapshot(key: string): Promise<void>;
    /**
     * Starts `count` (1 to 20) sandboxes from snapshot `key` (id or name), each a create
     * through the server's gate with the snapshot's spec: one entry per sandbox asked for,
     * the sandbox or why it did not start.
     */
    startFromSnapshot(key: string, count?: number, opts?: StartOptions): Promise<(Sandbox | CordonError)[]>;
    /** Creates a volume: an empty file system of `size` bytes (or "256M"), its quota. */
    createVolume(name: string, size: number | string): Promise<Volume>;
    volumes(): Promise<VolumeList>;
    volume(name: string): Promise<Volume>;
    /** Deletes a volume and its contents; refused while a sandbox mounts it. */
    deleteVolume(name: string): Promise<VolumeDeleted>;
    /** Your audit rows, oldest first (`after_id` pages on; at most 1000 a call). */
    audit(q?: {
        sandbox?: string;
        kind?: string;
        after_id?: number;
        since_ms?: number;
        limit?: number;
    }): Promise<AuditEvent[]>;
    /** Whether a token this server minted for a sandbox is active, and its claims. */
    introspectToken(token: string): Promise<TokenInfo>;
    /** The OIDC discovery document of the tokens the server mints for sandboxes. */
    openidConfiguration(): Promise<OidcConfiguration>;
    /** The public keys minted tokens verify with. */
    jwks(): Promise<Jwks>;
}
/** A sandbox's /work: list, stat, remove, rename, mkdir, directories as tar streams. */
export declare class Files {
    #private;
    constructor(sb: Sandbox);
    /** The entries of a directory, sorted by name. */
    list(path?: string): Promise<FileEntry[]>;
    /** The listing, with `truncated` for a directory of more than 10,000 entries. */
    listing(path?: string): Promise<Listing>;
    /** One entry; a symlink is reported as one. */
    stat(path: string): Promise<FileEntry>;
    /** Removes a file, a symlink or an empty directory (any directory with `recursive`). */
    remove(path: string, opts?: {
        recursive?: boolean;
    }): Promise<FileDone>;
    /** Renames or moves `from` to `to` (a file at `to` is replaced). */
    rename(from: string, to: string): Promise<FileDone>;
    /** Makes a directory (with `parents`, missing parents too and no error if it exists). */
    mkdir(path: string, opts?: {
        parents?: boolean;
    }): Promise<FileDone>;
    /** Extracts an uncompressed tar (bytes, a Blob or a stream, sent as it is read) into `path`. */
    uploadArchive(tar: Body, path?: string): Promise<ArchiveReport>;
    /** The directory `path` as a tar stream, read as the sandbox writes it. */
    downloadArchive(path: string): Promise<ReadableStream<Uint8Array>>;
}
/** A live sandbox. */
export declare class Sandbox {
    #private;
    readonly client: Cordon;
    readonly id: string;
    info: SandboxInfo;
    readonly files: Files;
    constructor(client: Cordon, info: SandboxInfo);
    /** Writes a file under /work: text, bytes, a Blob, or a stream of bytes (sent as it is read). */
    writeFile(path: string, data: Body, opts?: {
        mode?: number;
    }): Promise<FileWritten>;
    /** Reads a file under /work. */
    readFile(path: string): Promise<Uint8Array>;
    /** Reads a file under /work as text (UTF-8). */
    readText(path: string): Promise<string>;
    /** A file under /work as a stream, read as it arrives. */
    readFileStream(path: string): Promise<ReadableStream<Uint8Array>>;
    /** Runs a shell command (a string), code in `opts.lang`, or an argv (an array); waits for it. */
    exec(code: Command, opts?: ExecOptions): Promise<ExecResult>;
    /** Like `exec`, yielding stdout/stderr events as they come, then the outcome. */
    execStream(code: Command, opts?: ExecOptions): AsyncGenerator<ExecEvent>;
    /**
     * Starts a command in the background and returns its handle at once; `pty` runs it on a
     * pseudo-terminal of that size (all its output is stdout; closing its stdin sends ^D).
     */
    execBackground(code: Command, opts?: Omit<ExecOptions, "stdin"> & {
        pty?: PtySize;
    }): Promise<BackgroundExec>;
    /** The sandbox's background execs, running or ended, oldest first. */
    execs(): Promise<BackgroundExec[]>;
    /** The handle of background exec `id`. */
    execHandle(id: string): BackgroundExec;
    /** Reads its current state into `info`. */
    refresh(): Promise<SandboxInfo>;
    /**
     * Its CPU, memory and disk figures over time, oldest first: the samples taken from
     * `start_ms` to `end_ms` (milliseconds since the Unix epoch; each optional), one every 5 s,
     * the last hour kept.
     */
    metrics(opts?: {
        start_ms?: number;
        end_ms?: number;
    }): Promise<MetricSample[]>;
    /**
     * Stops its processes where they are; `toDisk` (microvm) saves it to disk and frees its memory;
     * `filesOnly` (container, gvisor) keeps its files only, and `resume()` starts it again from them.
     */
    pause(opts?: {
        toDisk?: boolean;
        filesOnly?: boolean;
    }): Promise<SandboxInfo>;
    resume(): Promise<SandboxInfo>;
    /**
     * Takes a snapshot of this sandbox, kept until you delete it: `mode` "full" (memory,
     * processes, files, where the tier can) or "filesystem" (files; processes start fresh);
     * left out, the most its tier keeps. The sandbox runs on.
     */
    createSnapshot(opts?: {
        name?: string;
        mode?: "full" | "filesystem";
    }): Promise<Snapshot>;
    /** `count` (1 to 20) new sandboxes from a snapshot of this one taken now (then deleted). */
    fork(count?: number, opts?: StartOptions): Promise<(Sandbox | CordonError)[]>;
    /** Changes its TTL (from its creation) or idle timeout, within the server's maxima. */
    update(opts: {
        ttl?: Duration;
        idle_timeout?: Duration;
    }): Promise<SandboxInfo>;
    /** Destroys the sandbox; calling it again is fine (`already` is then true). */
    destroy(): Promise<Destroyed>;
    /** Starts a long-lived interpreter whose state persists from one cell to the next. */
    createContext(lang?: ContextLang): Promise<Context>;
    contexts(): Promise<Context[]>;
    /** The sandbox's default context of `lang` (made at its first use). */
    defaultContext(lang?: ContextLang): Promise<Context>;
    /** Runs a cell in `opts.context` (default: the sandbox's default context of `opts.lang`). */
    runCode(code: string, opts?: {
        context?: Context;
        lang?: ContextLang;
        timeout?: Duration;
        onStdout?: (s: string) => void;
        onStderr?: (s: string) => void;
    }): Promise<CellResult>;
    /** @internal */
    forgetContext(id: string): void;
}
/** A code context: a long-lived interpreter in a sandbox. */
export declare class Context {
    #private;
    readonly sandbox: Sandbox;
    readonly id: string;
    info: ContextInfo;
    constructor(sandbox: Sandbox, info: ContextInfo);
    /** Runs one cell; `onStdout`/`onStderr` receive its output as it comes. */
    run(code: string, opts?: {
        timeout?: Duration;
        onStdout?: (s: string) => void;
        onStderr?: (s: string) => void;
    }): Promise<CellResult>;
    /** Runs one cell, yielding stdout/stderr events as they come, then a result event. */
    runStream(code: string, opts?: {
        timeout?: Duration;
    }): AsyncGenerator<CellEvent>;
    /** Starts its interpreter again: every variable and import is gone. */
    restart(): Promise<ContextInfo>;
    /** Ends the context (its interpreter is killed). */
    close(): Promise<ContextInfo>;
}
/** A background exec: attach to its output (`for await`), write its stdin, stop it. */
export declare class BackgroundExec {
    #private;
    readonly sandbox: Sandbox;
    readonly id: string;
    info: ExecInfo;
    constructor(sandbox: Sandbox, info: ExecInfo);
    /** Attaches: the output kept since its start, live output, then the outcome event. */
    output(): AsyncGenerator<ExecEvent>;
    [Symbol.asyncIterator](): AsyncGenerator<ExecEvent>;
    /** Waits for its end; its stdout and stderr are what the sandbox kept. */
    wait(): Promise<ExecResult>;
    /** Writes to its stdin; `close` ends the stdin after these bytes. */
    sendStdin(data: string | Uint8Array, opts?: {
        close?: boolean;
    }): Promise<StdinWritten>;
    /** Sets its pseudo-terminal's size; an exec without one throws Unsupported. */
    resize(size: PtySize): Promise<ExecInfo>;
    /** SIGTERM to its process tree, SIGKILL after the server's grace (`force`: at once). */
    kill(opts?: {
        force?: boolean;
    }): Promise<ExecInfo>;
    /** Its entry in the sandbox's list. */
    status(): Promise<ExecInfo>;
}
export {};
