"""Python client of the Cordon sandbox service.

    from cordon import Cordon
    c = Cordon("http://127.0.0.1:7070", api_key="...")
    print(c.run("print(6*7)", lang="python").stdout)
    with c.sandbox(tier="container", ttl="10m") as sb:
        sb.write_file("/work/a.csv", b"x\\n1\\n2\\n")
        for event in sb.exec_stream("wc -l /work/a.csv"):
            print(event)
        print(sb.read_file("/work/a.csv"))
        print(sb.files.list("/work"))
        sb.files.upload_dir("./src", "/work/src")
        sb.files.download_dir("/work/src", "./out")
        sb.run_code("x = 41")                      # a long-lived interpreter: state persists
        print(sb.run_code("x + 1").text)           # "42"

Standard library only (urllib). Errors raise `CordonError` subclasses chosen by the API's
stable error code.
"""

from .client import (
    ArchiveReport,
    BackgroundExec,
    Context,
    ContextBusy,
    Cordon,
    CordonError,
    ExecResult,
    Execution,
    ExecutionError,
    FileEntry,
    Files,
    InvalidRequest,
    NotFound,
    PathRefused,
    PolicyDenied,
    Sandbox,
    ResourceBusy,
    SandboxBusy,
    SandboxGone,
    SandboxPaused,
    StreamEvent,
    TierUnavailable,
    TooManyContexts,
    TooManyExecs,
    TooManySandboxes,
    Unauthorized,
    Unsupported,
    VolumeExists,
    VolumeInUse,
    VolumeQuota,
)

__all__ = [
    "ArchiveReport",
    "BackgroundExec",
    "Context",
    "ContextBusy",
    "Cordon",
    "CordonError",
    "ExecResult",
    "Execution",
    "ExecutionError",
    "FileEntry",
    "Files",
    "InvalidRequest",
    "NotFound",
    "PathRefused",
    "PolicyDenied",
    "Sandbox",
    "ResourceBusy",
    "SandboxBusy",
    "SandboxGone",
    "SandboxPaused",
    "StreamEvent",
    "TierUnavailable",
    "TooManyContexts",
    "TooManyExecs",
    "TooManySandboxes",
    "Unauthorized",
    "Unsupported",
    "VolumeExists",
    "VolumeInUse",
    "VolumeQuota",
]
