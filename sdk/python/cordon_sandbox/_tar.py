"""Directories as tar streams, never whole in memory nor spooled to disk: a local directory
is written as a tar into a pipe by a worker thread while the request reads the other end,
and a download is extracted as its bytes arrive (tarfile's stream mode)."""

from __future__ import annotations

import io
import os
import queue
import tarfile
import threading
from typing import IO, Any, Iterator, List, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

# Pieces a download hands to its extracting thread at once (of at most 256 KiB each).
QUEUE_DEPTH = 4


def tar_dir(local_dir: PathLike, names: List[str], out: IO[bytes]) -> None:
    """Writes `names` of `local_dir` (and what is under them) into `out` as an uncompressed
    PAX tar, in stream mode (nothing is sought); symlinks go in as links (the server skips
    them)."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            tar.add(os.path.join(local_dir, name), arcname=name)


class TarPipe:
    """`with TarPipe(dir) as src:` — `src` reads the tar of `dir` as a thread writes it.
    A directory that cannot be listed raises at once; an error of the writer (an unreadable
    file) is raised when the block ends, in place of the request's own (which it caused)."""

    def __init__(self, local_dir: PathLike) -> None:
        self._dir = local_dir
        self._names = sorted(os.listdir(local_dir))
        self._error: Optional[BaseException] = None
        r, w = os.pipe()
        self.reader = os.fdopen(r, "rb")
        self._writer = os.fdopen(w, "wb")
        self._thread = threading.Thread(target=self._write, name="cordon-tar", daemon=True)

    def _write(self) -> None:
        try:
            with self._writer:
                tar_dir(self._dir, self._names, self._writer)
        except BrokenPipeError:
            pass  # the request ended first; its own error is the one raised
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            self._error = e

    def __enter__(self) -> IO[bytes]:
        self._thread.start()
        return self.reader

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        self.reader.close()  # a writer still writing gets EPIPE and stops
        self._thread.join()
        if self._error is not None:
            raise self._error


def _keep(skipped: List[str]) -> Any:
    def keep(member: tarfile.TarInfo, dest: str) -> Optional[tarfile.TarInfo]:
        try:
            return tarfile.data_filter(member, dest)
        except tarfile.FilterError:
            skipped.append(member.name)
            return None
    return keep


def untar(src: IO[bytes], local_dir: PathLike) -> List[str]:
    """Extracts a tar stream into `local_dir` (made if missing) as it is read, with
    tarfile's `data` filter: an entry that would leave `local_dir`, a link pointing out of
    it, a device is skipped. Returns the names skipped."""
    os.makedirs(local_dir, exist_ok=True)
    skipped: List[str] = []
    with tarfile.open(fileobj=src, mode="r|") as tar:
        tar.extractall(local_dir, filter=_keep(skipped))
    # The stream's end (padding after the archive's end): read, so the answer is whole and
    # its connection kept.
    while src.read(1 << 16):
        pass
    return skipped


class IterReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (a response's body)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            nxt = None if self._eof else self._next()
            if nxt is None:
                self._eof = True  # every later read is the end too
                return 0
            self._buf = nxt
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def _next(self) -> Optional[bytes]:
        return next(self._chunks, None)


class QueueReader(IterReader):
    """A readable file fed chunk by chunk from another thread (an asyncio download): `put`
    blocks while `QUEUE_DEPTH` chunks wait; `None` ends it."""

    def __init__(self) -> None:
        super().__init__(iter(()))
        self.queue: "queue.Queue[Optional[bytes]]" = queue.Queue(QUEUE_DEPTH)
        self.done = threading.Event()

    def _next(self) -> Optional[bytes]:
        return self.queue.get()

    def put(self, chunk: Optional[bytes]) -> bool:
        """Hands a chunk over; False once the reader has stopped (it failed or finished)."""
        while not self.done.is_set():
            try:
                self.queue.put(chunk, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False


def untar_queue(reader: QueueReader, local_dir: PathLike) -> List[str]:
    """`untar` from a `QueueReader`; marks it done when it stops, however it stops."""
    try:
        return untar(io.BufferedReader(reader), local_dir)
    finally:
        reader.done.set()
