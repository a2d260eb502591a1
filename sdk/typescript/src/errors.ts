/** Errors: one `CordonError` subclass per stable code of the API (docs/service.md). */

/** The body of an API error: `{code, message, fix}` and, for a refusal by a rule, `rule`. */
export interface ErrorBody {
  code: string;
  message: string;
  fix?: string;
  rule?: string;
}

/**
 * An error the API reported: `code` is stable, `message` says what, `fix` what to do, `rule`
 * names the operator's rule for a refusal by one, `retryAfter` (seconds) comes with a 429 or
 * 503 that says when to try again. `status` is the HTTP status (500 for an error reported as
 * a stream's last event).
 */
export class CordonError extends Error {
  readonly status: number;
  readonly code: string;
  readonly fix: string;
  readonly rule?: string;
  readonly retryAfter?: number;

  constructor(status: number, body: ErrorBody, retryAfter?: number) {
    super(body.fix ? `${body.code}: ${body.message} (fix: ${body.fix})` : `${body.code}: ${body.message}`);
    this.name = new.target.name;
    this.status = status;
    this.code = body.code;
    this.fix = body.fix ?? "";
    this.rule = body.rule;
    this.retryAfter = retryAfter;
  }
}

export class Unauthorized extends CordonError {}
export class TooManyFailures extends CordonError {}
export class NotFound extends CordonError {}
export class InvalidRequest extends CordonError {}
export class PayloadTooLarge extends InvalidRequest {}
export class PathRefused extends CordonError {}
export class FileError extends CordonError {}
export class PolicyDenied extends CordonError {}
export class TierUnavailable extends CordonError {}
export class LayerUnavailable extends TierUnavailable {}
export class GrantUnavailable extends CordonError {}
export class TooManySandboxes extends CordonError {}
export class ResourceBusy extends CordonError {}
export class SandboxBusy extends CordonError {}
export class SandboxGone extends CordonError {}
export class SandboxFailure extends CordonError {}
export class Unsupported extends CordonError {}
export class TooManyExecs extends CordonError {}
export class SandboxPaused extends CordonError {}
export class ContextBusy extends CordonError {}
export class TooManyContexts extends CordonError {}
export class VolumeExists extends CordonError {}
export class VolumeInUse extends CordonError {}
export class VolumeQuota extends CordonError {}
export class PausedQuota extends CordonError {}
export class SnapshotExists extends CordonError {}
export class SnapshotQuota extends CordonError {}
export class StorageLow extends CordonError {}
export class ShuttingDown extends CordonError {}
export class InternalError extends CordonError {}

type ErrorClass = new (status: number, body: ErrorBody, retryAfter?: number) => CordonError;

/** The class each code of the API raises. */
export const BY_CODE: Readonly<Record<string, ErrorClass>> = {
  unauthorized: Unauthorized,
  too_many_failures: TooManyFailures,
  not_found: NotFound,
  invalid_request: InvalidRequest,
  payload_too_large: PayloadTooLarge,
  unsupported_media_type: InvalidRequest,
  no_such_route: InvalidRequest,
  method_not_allowed: InvalidRequest,
  path_refused: PathRefused,
  file_error: FileError,
  policy_denied: PolicyDenied,
  tier_unavailable: TierUnavailable,
  layer_unavailable: LayerUnavailable,
  grant_unavailable: GrantUnavailable,
  too_many_sandboxes: TooManySandboxes,
  sandbox_busy: SandboxBusy,
  resource_busy: ResourceBusy,
  sandbox_gone: SandboxGone,
  sandbox_failure: SandboxFailure,
  unsupported: Unsupported,
  too_many_execs: TooManyExecs,
  sandbox_paused: SandboxPaused,
  context_busy: ContextBusy,
  too_many_contexts: TooManyContexts,
  volume_exists: VolumeExists,
  volume_in_use: VolumeInUse,
  volume_quota: VolumeQuota,
  paused_quota: PausedQuota,
  snapshot_exists: SnapshotExists,
  snapshot_quota: SnapshotQuota,
  storage_low: StorageLow,
  shutting_down: ShuttingDown,
  internal: InternalError,
};

/** The seconds of a `Retry-After` header (the server sends whole seconds). */
export function retryAfterSecs(value: string | null | undefined): number | undefined {
  if (value == null || value.trim() === "") return undefined;
  const n = Number(value.trim());
  return Number.isFinite(n) && n >= 0 ? n : undefined;
}

/** The error an API error body describes. */
export function errorFrom(status: number, body: ErrorBody, retryAfter?: string | null): CordonError {
  const cls = BY_CODE[body.code] ?? CordonError;
  return new cls(status, body, retryAfterSecs(retryAfter));
}

/** The error of an answer whose body is `text` (JSON, or anything else a proxy sent). */
export function errorFromText(status: number, text: string, retryAfter?: string | null): CordonError {
  try {
    const body = JSON.parse(text) as ErrorBody;
    if (typeof body.code === "string" && typeof body.message === "string") {
      return errorFrom(status, body, retryAfter);
    }
  } catch {
    // not JSON: below
  }
  return new CordonError(status, {
    code: "http_error",
    message: `HTTP ${status}: ${text.slice(0, 500)}`,
    fix: "check the server's URL (CORDON_URL)",
  });
}
