/**
 * The API's answers and request fields as types (docs/openapi.json's schemas). Field names
 * are the wire's own (snake_case), so they read as the API's documentation does. Times are
 * milliseconds since the Unix epoch (`*_ms`), durations microseconds (`*_us`), sizes bytes.
 */

export type Tier = "runtime" | "wasm" | "container" | "gvisor" | "microvm";
export type Lang = "python" | "py" | "bash" | "sh" | "javascript" | "js";
export type Termination =
  | "exited" | "signalled" | "timeout" | "out-of-memory" | "process-limit" | "output-limit"
  | "disk-limit" | "killed" | "sandbox-failure" | "cancelled";
/** "10m", "30s", or seconds. */
export type Duration = string | number;

export interface Limits {
  timeout_ms?: number;
  memory_bytes?: number;
  pids?: number;
  disk_bytes?: number;
  tmp_bytes?: number;
  cpus?: number;
  stdout_bytes?: number;
  stderr_bytes?: number;
  open_files?: number;
  fuel?: number;
}

export interface Usage {
  cpu_time_us: number;
  peak_memory_bytes: number;
  wall_time_us: number;
}

export interface Timings {
  start_us: number;
  run_us: number;
  destroy_us?: number;
  program_us?: number;
}

/** A credential format or known secret found in what left the sandbox (never the value). */
export interface Finding {
  kind:
    | "known_secret" | "private_key" | "aws_access_key_id" | "github_token" | "gitlab_token"
    | "slack_token" | "stripe_key" | "google_api_key" | "ai_api_key" | "jwt";
  /** the output stream (stdout, stderr) or the file taken out */
  stream?: string | null;
  file?: string | null;
  /** byte offset in the input */
  offset: number;
  /** length in bytes */
  len: number;
  /** whether it was replaced in the output */
  redacted: boolean;
  /** for a known secret, its name */
  name?: string | null;
}

/** One egress decision of the sandbox's proxy (`path` never carries the query). */
export interface EgressEvent {
  time_ms: number;
  sandbox: string;
  /** the client connection's number within the proxy, from 1 */
  conn: number;
  kind: "http" | "connect" | "https" | "connection";
  decision: "allow" | "deny" | "exfiltration" | "limit" | "error" | "closed" | "truncated";
  /** how many identical events this row stands for */
  count?: number;
  last_ms?: number | null;
  host?: string | null;
  port?: number | null;
  addr?: string | null;
  method?: string | null;
  path?: string | null;
  status?: number | null;
  terminated?: boolean | null;
  /** the rule that decided (`allow api.example.test`, `default-deny`, `grant:github`, ...) */
  rule?: string | null;
  reason?: string | null;
  /** the grant whose secret was added (its name) */
  grant?: string | null;
  bytes_up?: number | null;
  bytes_down?: number | null;
  /** a kubelet pod's `namespace/name` (cordon-oci) */
  pod?: string | null;
}

/** An outcome's details: findings, egress decisions, how the sandbox failed, the microVM's accelerator. */
export interface Details {
  findings?: Finding[];
  egress?: EgressEvent[];
  failure?: string | null;
  accelerator?: string | null;
}

/** How an exec ended. `exit_code` is null unless `termination` is "exited". */
export interface ExecResult {
  tier: Tier;
  termination: Termination;
  exit_code: number | null;
  signal: number | null;
  stdout: string;
  stderr: string;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  usage: Usage;
  timings: Timings;
  weakened?: string[];
  warnings?: string[];
  /** findings, egress decisions and failure details */
  extra?: Details;
}

/** Output as it comes (UTF-8, split safely across chunks). */
export interface OutputEvent {
  type: "stdout" | "stderr";
  data: string;
}
/** An exec's stream: output, then its outcome. */
export type ExecEvent = OutputEvent | { type: "outcome"; outcome: ExecResult };
/** A code cell's stream: output, then its result. */
export type CellEvent = OutputEvent | { type: "result"; result: CellResult };
export type StreamEvent = ExecEvent | CellEvent;

export interface SandboxInfo {
  id: string;
  tier: Tier;
  /** live, paused, destroying (its teardown runs), destroyed */
  state: string;
  created_ms: number;
  expires_ms: number;
  idle_timeout_ms: number;
  last_used_ms: number;
  limits: Limits;
  allow_hosts: string[];
  /** pool (a warm, never-used sandbox) or cold */
  source: string;
  start_us: number;
  busy: boolean;
  paused: boolean;
  on_disk?: boolean;
  on_disk_bytes?: number;
  labels: Record<string, string>;
  /** what its TTL or idle timeout does, when not destroy */
  on_timeout?: "pause" | "pause_files";
  /** how many times a resume started it again from its files (`pause({ filesOnly: true })`) */
  restarts?: number;
}

export interface SandboxList {
  sandboxes: SandboxInfo[];
  /** what your sandboxes paused to disk hold */
  on_disk_bytes: number;
}

export interface Destroyed {
  id: string;
  state: "destroyed";
  /** an earlier destroy (or the reaper) had done it */
  already: boolean;
}

export interface Health {
  status: string;
  version?: string;
  tiers?: Record<string, string>;
  pools?: Record<string, { size: number; ready: number }>;
  live_sandboxes?: number;
}

export interface FileWritten {
  path: string;
  bytes: number;
}

export type FileKind = "file" | "dir" | "symlink" | "fifo" | "socket" | "char_device" | "block_device";

/** A directory entry, or what stat found (with `path`); a symlink is reported, never followed. */
export interface FileEntry {
  name: string;
  kind: FileKind;
  size: number;
  mode: number;
  mtime_ms: number;
  path?: string;
  /** where a symlink points, its text as written (never followed) */
  target?: string | null;
  /** the user metadata on a file or directory (its `user.e2b.*` extended attributes, by key) */
  metadata?: Record<string, string>;
}

export interface Listing {
  path: string;
  entries: FileEntry[];
  truncated: boolean;
}

export interface FileDone {
  op: "remove" | "rename" | "mkdir";
  path: string;
  to?: string;
}

export interface ArchiveReport {
  files: number;
  dirs: number;
  bytes: number;
  symlinks?: number;
  skipped?: { path: string; reason: string }[];
}

export interface PtySize {
  rows: number;
  cols: number;
}

/** A background exec as listed. */
export interface ExecInfo {
  id: string;
  command: string;
  state: "running" | "exited";
  started_ms: number;
  ended_ms?: number;
  exit_code?: number;
  signal?: number;
  pty?: PtySize;
}

export interface StdinWritten {
  bytes: number;
  closed: boolean;
}

/** A code context's language (`typescript` cells become JavaScript before Node runs them). */
export type ContextLang = "python" | "javascript" | "typescript" | "bash";

export interface ContextInfo {
  id: string;
  lang: ContextLang;
  default: boolean;
  state: "ready" | "running" | "dead" | "deleted";
  created_ms: number;
  started_ms: number;
  execution_count: number;
  version: string;
  restarts: number;
  /** the directory its code runs in */
  cwd: string;
}

/**
 * What a code cell did: `text` is its last expression's value as a REPL shows it, `results`
 * its rich outputs (each a MIME bundle), `logs` what it wrote, `error` set when it raised,
 * timed out or its interpreter died.
 */
export interface CellResult {
  context: string;
  status: "ok" | "error" | "timeout" | "died";
  text?: string;
  results: { main: boolean; data: Record<string, string> }[];
  logs: { stdout: string[]; stderr: string[] };
  error?: { name: string; value: string; traceback: string };
  execution_count: number;
  restarted: boolean;
  duration_us: number;
  warnings?: string[];
}

export interface Volume {
  name: string;
  size: number;
  used: number;
  created_ms: number;
  mounts: { sandbox: string; read_only: boolean; since_ms: number }[];
}

export interface VolumeList {
  volumes: Volume[];
  used_bytes: number;
  quota_bytes: number;
  allocated_bytes: number;
  max_volumes: number;
}

export interface VolumeDeleted {
  name: string;
  deleted: boolean;
}

export interface VolumeMount {
  name: string;
  path: string;
  read_only?: boolean;
}

export interface AuditEvent {
  id: number;
  time_ms: number;
  tenant: string | null;
  sandbox: string | null;
  kind: string;
  decision: string | null;
  tier: string | null;
  detail: Record<string, unknown>;
}

/** The OIDC discovery document of the tokens the server mints for sandboxes. */
export interface OidcConfiguration {
  issuer: string;
  jwks_uri: string;
  introspection_endpoint: string;
  id_token_signing_alg_values_supported: string[];
  response_types_supported: string[];
  subject_types_supported: string[];
  claims_supported: string[];
}

/** The public keys minted tokens verify with. */
export interface Jwks {
  keys: { kty: string; kid: string; [field: string]: unknown }[];
}

export interface TokenInfo {
  active: boolean;
  [claim: string]: unknown;
}

/** What a sandbox is made with (CreateRequest). */
export interface SandboxSpec {
  tier?: Tier | "auto";
  limits?: Limits;
  env?: Record<string, string>;
  allow_hosts?: string[];
  deny_hosts?: string[];
  grants?: string[];
  allow_weaker?: ("landlock" | "seccomp" | "cgroups")[];
  template?: string;
  ttl?: Duration;
  idle_timeout?: Duration;
  /**
   * pause (instead of destroy) at its TTL or idle timeout; a resume gives it its TTL again;
   * pause_files keeps its files only (container, gvisor) and a resume boots it again from them
   */
  on_timeout?: "destroy" | "pause" | "pause_files";
  trust?: "trusted" | "untrusted";
  autonomy?: "compute" | "read-files" | "write-files" | "install-packages" | "internet";
  shape?: "many-short" | "one-long";
  labels?: Record<string, string>;
  /** `"name:/work/path"`, `"name:/work/path:ro"` or a mount */
  volumes?: (string | VolumeMount)[];
}

/** How an exec runs. */
export interface ExecOptions {
  /** the language of code given as a string (sh when none); not for an argv */
  lang?: Lang;
  timeout?: Duration;
  stdin?: string | Uint8Array;
  env?: Record<string, string>;
  cwd?: string;
  /** aborts the call; the server stops a foreground exec whose client goes away */
  signal?: AbortSignal;
}

/** A one-shot run's sandbox lives for its exec: no life fields; it runs in /work (no cwd). */
export interface RunOptions extends Omit<SandboxSpec, "ttl" | "idle_timeout" | "on_timeout" | "labels" | "volumes">, Omit<ExecOptions, "cwd"> {
  /** files to put under /work first: path to contents */
  files?: Record<string, string | Uint8Array>;
}

/** A snapshot you keep: `mode` full (memory, processes, files) or filesystem (files; processes start fresh). */
export interface Snapshot {
  id: string;
  name?: string;
  tier: Tier;
  mode: "full" | "filesystem";
  /** What it holds on disk, counted in your max_snapshot_bytes. */
  bytes: number;
  /** The sandbox it was taken of. */
  source: string;
  created_ms: number;
  template?: string;
}

/** Sandboxes started from a snapshot (or a fork): those that started, and why others did not. */
export interface SnapshotStarts {
  snapshot: string;
  sandboxes: SandboxInfo[];
  errors?: { code: string; message: string; fix?: string; rule?: string }[];
}

/** The life and labels of sandboxes started from a snapshot. */
export interface StartOptions {
  ttl?: Duration;
  idle_timeout?: Duration;
  labels?: Record<string, string>;
}

/**
 * One sample of a sandbox's figures (`Sandbox.metrics()`), taken every 5 s from its tier's
 * own accounting: CPU (its limit rounded up, and the share of it used since the sample
 * before, in percent), memory charged (page cache included) and its limit, the page cache,
 * bytes used on its workspace (0 where the tier cannot tell: microvm) and its disk limit.
 */
export interface MetricSample {
  at_ms: number;
  cpu_count: number;
  cpu_used_pct: number;
  mem_used: number;
  mem_total: number;
  mem_cache: number;
  disk_used: number;
  disk_total: number;
}
