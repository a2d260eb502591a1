"""One transport for both clients: httpx, kept-alive connections, one retry on a 429 that
says when (`Retry-After`), errors mapped to `CordonError` subclasses.

A request is described once as a `Call` (method, path, query, body, how to read the
answer); `SyncTransport` and `AsyncTransport` carry it out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import (IO, Any, AsyncIterator, Callable, Dict, Generic, Iterable, Iterator,
                    List, Optional, Sequence, Tuple, TypeVar, Union)

import httpx

from . import errors
from .models import ExecResult, Execution, StreamEvent

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:7070"
CHUNK = 256 << 10
# A 429's Retry-After longer than this is not waited for: the error is raised at once.
MAX_RETRY_WAIT = 60.0

Data = Union[bytes, bytearray, memoryview, str, IO[bytes], Iterable[bytes]]


def settings(url: Optional[str], api_key: Optional[str]) -> Tuple[str, str]:
    """The server's URL and the key: given, else `CORDON_URL` and `CORDON_API_KEY`."""
    url = url or os.environ.get("CORDON_URL") or DEFAULT_URL
    key = api_key if api_key is not None else os.environ.get("CORDON_API_KEY")
    if not key:
        raise ValueError("no API key: pass api_key=... or set CORDON_API_KEY "
                         "(the operator makes one with `cordon serve --new-key TENANT`)")
    return url.rstrip("/"), key


class Body:
    """A request body that can be sent (and, when it can be read again, sent once more)."""

    def __init__(self, data: Data) -> None:
        if isinstance(data, str):
            data = data.encode()
        self.data = data
        self._start: Optional[int] = None
        if hasattr(data, "read") and hasattr(data, "seek"):
            try:
                self._start = data.tell()  # type: ignore[union-attr]
            except (OSError, ValueError):
                self._start = None

    @property
    def replayable(self) -> bool:
        return isinstance(self.data, (bytes, bytearray, memoryview)) or self._start is not None

    def rewind(self) -> None:
        if self._start is not None:
            self.data.seek(self._start)  # type: ignore[union-attr]

    def sync(self) -> Union[bytes, Iterator[bytes]]:
        d = self.data
        if isinstance(d, (bytes, bytearray, memoryview)):
            return bytes(d)
        if hasattr(d, "read"):
            return iter(lambda: d.read(CHUNK), b"")
        return iter(d)

    def aio(self) -> Union[bytes, AsyncIterator[bytes]]:
        d = self.data
        if isinstance(d, (bytes, bytearray, memoryview)):
            return bytes(d)
        if hasattr(d, "__aiter__"):
            return d  # type: ignore[return-value]
        return _chunks_in_thread(d)


async def _chunks_in_thread(d: Any) -> AsyncIterator[bytes]:
    """Reads a file (or a blocking iterator) in a worker thread, chunk by chunk."""
    it = iter(lambda: d.read(CHUNK), b"") if hasattr(d, "read") else iter(d)
    while True:
        chunk = await asyncio.to_thread(next, it, None)
        if chunk is None:
            return
        yield chunk


@dataclass
class Call(Generic[T]):
    """One API request and how its JSON answer becomes a model."""

    method: str
    path: str
    parse: Callable[[Any], T]
    json: Any = None
    params: Sequence[Tuple[str, str]] = ()
    body: Optional[Body] = None
    headers: Dict[str, str] = field(default_factory=dict)


def event(line: bytes) -> Optional[StreamEvent]:
    """One NDJSON line of a stream; an `error` event raises its error."""
    if not line.strip():
        return None
    ev = json.loads(line)
    t = ev["type"]
    if t == "outcome":
        return StreamEvent("outcome", outcome=ExecResult.from_json(ev["outcome"]))
    if t == "result":
        return StreamEvent("result", result=Execution.from_json(ev["result"]))
    if t == "error":
        raise errors.from_json(500, ev["error"])
    return StreamEvent(t, data=ev.get("data", ""))


def _request(client: Union[httpx.Client, httpx.AsyncClient], call: Call[Any], content: Any,
             accept: Optional[str]) -> httpx.Request:
    headers = dict(call.headers)
    if accept:
        headers["Accept"] = accept
    return client.build_request(call.method, call.path, params=list(call.params) or None,
                                json=call.json, content=content, headers=headers)


def _retry_wait(resp: httpx.Response, call: Call[Any], tries_left: int) -> Optional[float]:
    """Seconds to wait before sending `call` again after `resp`, or None for no retry."""
    if resp.status_code != 429 or tries_left <= 0:
        return None
    if call.body is not None and not call.body.replayable:
        return None
    wait = errors.retry_after_secs(resp.headers.get("Retry-After"))
    if wait is None or wait > MAX_RETRY_WAIT:
        return None
    return wait


def _error(resp: httpx.Response, body: bytes) -> errors.CordonError:
    return errors.from_body(resp.status_code, body, resp.headers.get("Retry-After"))


def _limits() -> httpx.Limits:
    return httpx.Limits(max_keepalive_connections=8, keepalive_expiry=30.0)


class SyncTransport:
    def __init__(self, url: str, api_key: str, timeout: float, retries: int,
                 client: Optional[httpx.Client] = None) -> None:
        self.url = url
        self.retries = retries
        self.http = client or httpx.Client(limits=_limits())
        self.http.base_url = httpx.URL(url)
        self.http.headers["Authorization"] = f"Bearer {api_key}"
        self.http.timeout = httpx.Timeout(timeout)

    def close(self) -> None:
        self.http.close()

    @contextlib.contextmanager
    def open(self, call: Call[Any], accept: Optional[str] = None) -> Iterator[httpx.Response]:
        """Sends `call` and yields the answer with its body unread (a stream)."""
        tries_left = self.retries
        while True:
            if call.body is not None:
                call.body.rewind()
            content = call.body.sync() if call.body is not None else None
            resp = self.http.send(_request(self.http, call, content, accept), stream=True)
            try:
                if resp.is_success:
                    yield resp
                    return
                wait = _retry_wait(resp, call, tries_left)
                if wait is None:
                    raise _error(resp, resp.read())
            finally:
                resp.close()
            tries_left -= 1
            time.sleep(wait)

    def json(self, call: Call[T]) -> T:
        with self.open(call) as resp:
            return call.parse(json.loads(resp.read()))

    def read(self, call: Call[Any]) -> bytes:
        with self.open(call) as resp:
            return resp.read()

    def events(self, call: Call[Any]) -> Iterator[StreamEvent]:
        with self.open(call, "application/x-ndjson") as resp:
            for line in resp.iter_lines():
                ev = event(line.encode())
                if ev is not None:
                    yield ev

    def download(self, call: Call[Any], out: IO[bytes]) -> int:
        n = 0
        with self.open(call) as resp:
            for chunk in resp.iter_bytes(CHUNK):
                out.write(chunk)
                n += len(chunk)
        return n


class AsyncTransport:
    def __init__(self, url: str, api_key: str, timeout: float, retries: int,
                 client: Optional[httpx.AsyncClient] = None) -> None:
        self.url = url
        self.retries = retries
        self.http = client or httpx.AsyncClient(limits=_limits())
        self.http.base_url = httpx.URL(url)
        self.http.headers["Authorization"] = f"Bearer {api_key}"
        self.http.timeout = httpx.Timeout(timeout)

    async def close(self) -> None:
        await self.http.aclose()

    @contextlib.asynccontextmanager
    async def open(self, call: Call[Any],
                   accept: Optional[str] = None) -> AsyncIterator[httpx.Response]:
        tries_left = self.retries
        while True:
            if call.body is not None:
                call.body.rewind()
            content = call.body.aio() if call.body is not None else None
            resp = await self.http.send(_request(self.http, call, content, accept), stream=True)
            try:
                if resp.is_success:
                    yield resp
                    return
                wait = _retry_wait(resp, call, tries_left)
                if wait is None:
                    raise _error(resp, await resp.aread())
            finally:
                await resp.aclose()
            tries_left -= 1
            await asyncio.sleep(wait)

    async def json(self, call: Call[T]) -> T:
        async with self.open(call) as resp:
            return call.parse(json.loads(await resp.aread()))

    async def read(self, call: Call[Any]) -> bytes:
        async with self.open(call) as resp:
            return await resp.aread()

    async def events(self, call: Call[Any]) -> AsyncIterator[StreamEvent]:
        async with self.open(call, "application/x-ndjson") as resp:
            async for line in resp.aiter_lines():
                ev = event(line.encode())
                if ev is not None:
                    yield ev

    async def download(self, call: Call[Any], out: IO[bytes]) -> int:
        n = 0
        async with self.open(call) as resp:
            async for chunk in resp.aiter_bytes(CHUNK):
                await asyncio.to_thread(out.write, chunk)
                n += len(chunk)
        return n

