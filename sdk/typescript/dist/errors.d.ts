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
export declare class CordonError extends Error {
    readonly status: number;
    readonly code: string;
    readonly fix: string;
    readonly rule?: string;
    readonly retryAfter?: number;
    constructor(status: number, body: ErrorBody, retryAfter?: number);
}
export declare class Unauthorized extends CordonError {
}
export declare class TooManyFailures extends CordonError {
}
export declare class NotFound extends CordonError {
}
export declare class InvalidRequest extends CordonError {
}
export declare class PayloadTooLarge extends InvalidRequest {
}
export declare class PathRefused extends CordonError {
}
export declare class FileError extends CordonError {
}
export declare class PolicyDenied extends CordonError {
}
export declare class TierUnavailable extends CordonError {
}
export declare class LayerUnavailable extends TierUnavailable {
}
export declare class GrantUnavailable extends CordonError {
}
export declare class TooManySandboxes extends CordonError {
}
export declare class ResourceBusy extends CordonError {
}
export declare class SandboxBusy extends CordonError {
}
export declare class SandboxGone extends CordonError {
}
export declare class SandboxFailure extends CordonError {
}
export declare class Unsupported extends CordonError {
}
export declare class TooManyExecs extends CordonError {
}
export declare class SandboxPaused extends CordonError {
}
export declare class ContextBusy extends CordonError {
}
export declare class TooManyContexts extends CordonError {
}
export declare class VolumeExists extends CordonError {
}
export declare class VolumeInUse extends CordonError {
}
export declare class VolumeQuota extends CordonError {
}
export declare class PausedQuota extends CordonError {
}
export declare class SnapshotExists extends CordonError {
}
export declare class SnapshotQuota extends CordonError {
}
export declare class StorageLow extends CordonError {
}
export declare class ShuttingDown extends CordonError {
}
export declare class InternalError extends CordonError {
}
type ErrorClass = new (status: number, body: ErrorBody, retryAfter?: number) => CordonError;
/** The class each code of the API raises. */
export declare const BY_CODE: Readonly<Record<string, ErrorClass>>;
/** The seconds of a `Retry-After` header (the server sends whole seconds). */
export declare function retryAfterSecs(value: string | null | undefined): number | undefined;
/** The error an API error body describes. */
export declare function errorFrom(status: number, body: ErrorBody, retryAfter?: string | null): CordonError;
/** The error of an answer whose body is `text` (JSON, or anything else a proxy sent). */
export declare function errorFromText(status: number, text: string, retryAfter?: string | null): CordonError;
export {};
