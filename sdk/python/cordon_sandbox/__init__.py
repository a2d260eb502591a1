"""Python client of the Cordon sandbox service (distribution `cordon-sandbox`).

    from cordon_sandbox import Cordon
    c = Cordon()                      # CORDON_URL and CORDON_API_KEY from the environment
    print(c.run("print(6*7)", lang="python").stdout)
    with c.sandbox(tier="container", ttl="10m") as sb:
        sb.write_file("/work/a.csv", b"x\\n1\\n2\\n")
        for event in sb.exec_stream("wc -l /work/a.csv"):
            print(event)
        print(sb.files.list("/work"))
        sb.run_code("x = 41")                      # a long-lived interpreter: state persists
        print(sb.run_code("x + 1").text)           # "42"

`cordon_sandbox.aio.AsyncCordon` is the same client for asyncio. Both use httpx, keep
connections alive, stream uploads and downloads, and send a request once more after a 429
that says when (`Retry-After`). Answers are typed models (`cordon_sandbox.models`); errors
raise `CordonError` subclasses chosen by the API's stable error code.
"""

from .aio import AsyncBackgroundExec, AsyncContext, AsyncCordon, AsyncFiles, AsyncSandbox
from .client import BackgroundExec, Context, Cordon, Files, Sandbox
from .errors import (ContextBusy, CordonError, FileError, GrantUnavailable, InternalError,
                     InvalidRequest, LayerUnavailable, NotFound, PathRefused, PausedQuota,
                     PayloadTooLarge, PolicyDenied, ResourceBusy, SandboxBusy, SandboxFailure,
                     SandboxGone, SandboxPaused, ShuttingDown, SnapshotExists, SnapshotQuota,
                     StorageLow, TierUnavailable,
                     TooManyContexts, TooManyExecs, TooManyFailures, TooManySandboxes,
                     Unauthorized, Unsupported, VolumeExists, VolumeInUse, VolumeQuota)
from .models import (ArchiveReport, AuditEvent, ContextInfo, Destroyed, Details, EgressEvent,
                     ExecInfo, ExecResult, Execution, ExecutionError, FileDone, FileEntry,
                     FileWritten, Finding, Health,
                     Jwks, Limits, Listing, MetricSample, OidcConfiguration, PoolStatus, SandboxInfo, SandboxList, Snapshot,
                     SnapshotStarts, StdinWritten,
                     StreamEvent, Timings, TokenInfo, Usage, Volume, VolumeDeleted,
                     VolumeList, VolumeMountInfo)

__version__ = "0.2.0"

__all__ = [
    "ArchiveReport", "AsyncBackgroundExec", "AsyncContext", "AsyncCordon", "AsyncFiles",
    "AsyncSandbox", "AuditEvent", "BackgroundExec", "Context", "ContextBusy", "ContextInfo",
    "Cordon", "CordonError", "Destroyed", "Details", "EgressEvent", "ExecInfo", "ExecResult", "Execution",
    "ExecutionError", "FileDone", "FileEntry", "FileError", "FileWritten", "Files", "Finding",
    "GrantUnavailable", "Health", "InternalError", "InvalidRequest", "Jwks", "LayerUnavailable",
    "Limits", "Listing", "MetricSample", "NotFound", "OidcConfiguration", "PathRefused", "PausedQuota", "PayloadTooLarge",
    "PolicyDenied", "PoolStatus", "ResourceBusy", "Sandbox", "SandboxBusy", "SandboxFailure",
    "SandboxGone", "SandboxInfo", "SandboxList", "SandboxPaused", "ShuttingDown",
    "Snapshot", "SnapshotExists", "SnapshotQuota", "SnapshotStarts",
    "StdinWritten", "StorageLow", "StreamEvent", "TierUnavailable", "Timings", "TokenInfo",
    "TooManyContexts", "TooManyExecs", "TooManyFailures", "TooManySandboxes", "Unauthorized",
    "Unsupported", "Usage", "Volume", "VolumeDeleted", "VolumeExists", "VolumeInUse",
    "VolumeList", "VolumeMountInfo", "VolumeQuota", "__version__",
]
