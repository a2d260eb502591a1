"""Errors: one `CordonError` subclass per stable code of the API (docs/service.md)."""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional, Type


class CordonError(Exception):
    """An error the API reported: `code` is stable, `message` says what, `fix` what to do,
    `rule` names the operator's rule for a refusal by one, `retry_after` (seconds) comes
    with a 429 or 503 that says when to try again. `status` is the HTTP status (500 for an
    error reported as a stream's last event)."""

    def __init__(self, status: int, code: str, message: str, fix: str = "",
                 retry_after: Optional[float] = None, rule: Optional[str] = None) -> None:
        super().__init__(f"{code}: {message} (fix: {fix})" if fix else f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.fix = fix
        self.retry_after = retry_after
        self.rule = rule


class Unauthorized(CordonError):
    """The API key is missing or wrong."""


class TooManyFailures(CordonError):
    """Too many wrong keys from this address: wait `retry_after` seconds."""


class NotFound(CordonError):
    """No such sandbox, exec, context or volume (or it belongs to another tenant)."""


class InvalidRequest(CordonError):
    """The request was malformed or named unknown fields."""


class PayloadTooLarge(InvalidRequest):
    """The body passed the server's limit for it (http.max_*_bytes)."""


class PathRefused(CordonError):
    """A file path outside /work, with '..', or a symlink."""


class FileError(CordonError):
    """A file call failed in the sandbox (no such file, not a directory, disk full...)."""


class PolicyDenied(CordonError):
    """The operator's ceiling or the tier policy refused the spec; `rule` names which."""


class TierUnavailable(CordonError):
    """The tier cannot run on the server's host."""


class LayerUnavailable(TierUnavailable):
    """A wall of the tier (Landlock, seccomp, cgroups) cannot be applied on the server's host."""


class GrantUnavailable(CordonError):
    """A grant the request names cannot be loaded now."""


class TooManySandboxes(CordonError):
    """A concurrency limit is full; `retry_after` says when to try again."""


class ResourceBusy(CordonError):
    """Your share of a resource the server shares between tenants (host descriptors, the
    compile queue) is in use by your own other requests; `retry_after` says when to retry."""


class SandboxBusy(CordonError):
    """The sandbox is running another request."""


class SandboxGone(CordonError):
    """The sandbox was destroyed."""


class SandboxFailure(CordonError):
    """The sandbox failed (its tier reported an error); create a new one."""


class Unsupported(CordonError):
    """The sandbox's tier (or its build) cannot do this; `fix` says what can."""


class TooManyExecs(CordonError):
    """The sandbox has its limit of background execs running."""


class SandboxPaused(CordonError):
    """The sandbox is paused: resume it first."""


class ContextBusy(CordonError):
    """The code context is running another cell (one at a time per context)."""


class TooManyContexts(CordonError):
    """The sandbox holds its limit of code contexts: delete one first."""


class VolumeExists(CordonError):
    """You have a volume of that name already."""


class VolumeInUse(CordonError):
    """The volume is mounted: read-write by another sandbox, or by any to delete it."""


class VolumeQuota(CordonError):
    """The volume would pass your volume ceiling (count or bytes)."""


class PausedQuota(CordonError):
    """A pause to disk could pass your ceiling of bytes paused to disk."""


class StorageLow(CordonError):
    """The server's disk is nearly full: it refuses new sandboxes for now."""


class SnapshotExists(CordonError):
    """You have a snapshot of that name already."""


class SnapshotQuota(CordonError):
    """The snapshot would pass your `max_snapshot_bytes`: delete snapshots first."""


class ShuttingDown(CordonError):
    """The server is stopping."""


class InternalError(CordonError):
    """The server failed; its log says why."""


BY_CODE: Dict[str, Type[CordonError]] = {
    "unauthorized": Unauthorized,
    "too_many_failures": TooManyFailures,
    "not_found": NotFound,
    "invalid_request": InvalidRequest,
    "payload_too_large": PayloadTooLarge,
    "unsupported_media_type": InvalidRequest,
    "no_such_route": InvalidRequest,
    "method_not_allowed": InvalidRequest,
    "path_refused": PathRefused,
    "file_error": FileError,
    "policy_denied": PolicyDenied,
    "tier_unavailable": TierUnavailable,
    "layer_unavailable": LayerUnavailable,
    "grant_unavailable": GrantUnavailable,
    "too_many_sandboxes": TooManySandboxes,
    "sandbox_busy": SandboxBusy,
    "resource_busy": ResourceBusy,
    "sandbox_gone": SandboxGone,
    "sandbox_failure": SandboxFailure,
    "unsupported": Unsupported,
    "too_many_execs": TooManyExecs,
    "sandbox_paused": SandboxPaused,
    "context_busy": ContextBusy,
    "too_many_contexts": TooManyContexts,
    "volume_exists": VolumeExists,
    "volume_in_use": VolumeInUse,
    "volume_quota": VolumeQuota,
    "paused_quota": PausedQuota,
    "snapshot_exists": SnapshotExists,
    "snapshot_quota": SnapshotQuota,
    "storage_low": StorageLow,
    "shutting_down": ShuttingDown,
    "internal": InternalError,
}


def retry_after_secs(value: Optional[str]) -> Optional[float]:
    """The seconds of a `Retry-After` header (the server sends whole seconds)."""
    if value is None:
        return None
    try:
        secs = float(value.strip())
    except ValueError:
        return None
    return secs if secs >= 0 else None


def from_body(status: int, body: bytes, retry_after: Optional[str] = None) -> CordonError:
    """The error an answer's body describes (`{"code", "message", "fix", "rule"}`)."""
    try:
        d = json.loads(body)
        return from_json(status, d, retry_after)
    except (ValueError, KeyError, TypeError):
        text = body.decode("utf-8", "replace")[:500]
        return CordonError(status, "http_error", f"HTTP {status}: {text}",
                           "check the server's URL (CORDON_URL)")


def from_json(status: int, d: Mapping[str, Any], retry_after: Optional[str] = None) -> CordonError:
    cls = BY_CODE.get(d["code"], CordonError)
    return cls(status, d["code"], d["message"], d.get("fix", ""), retry_after_secs(retry_after),
               d.get("rule"))
