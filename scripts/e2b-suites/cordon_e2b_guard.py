"""A pytest plugin that keeps E2B's own test suites on this machine (scripts/e2b-suites.sh).

E2B's tests were written for E2B's cloud: some curl public sites from inside a sandbox, some
open `https://<port>-<id>.<domain>` URLs. Run against Cordon, no byte may leave the host:

- a test whose source names a public host (a URL whose host is not loopback, or a public IPv4
  literal) is deselected before it runs and counted as "names a public host";
- in the test process, resolving any name but `localhost` (and `*.localhost`) and connecting
  to any address but loopback raise `PermissionError`, so a test that tries anyway fails
  loudly instead of sending."""

import inspect
import ipaddress
import re
import socket

import pytest

_URL = re.compile(r"\b(?:https?|wss?)://([A-Za-z0-9.\-\[\]:]+)")
_IPV4 = re.compile(r"(?<![\w.])(\d{1,3}(?:\.\d{1,3}){3})(?![\w.])")
# Names that never resolve to a public host (RFC 2606, RFC 6761) or are never dialled.
_SAFE_SUFFIXES = (".localhost", ".test", ".example", ".invalid")


def _loopback_host(host: str) -> bool:
    host = host.strip("[]").split(":")[0] if host.count(":") <= 1 else host.strip("[]")
    h = host.lower().rstrip(".")
    if h in ("localhost", "") or h.endswith(_SAFE_SUFFIXES) or "{" in h:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def public_hosts(source: str) -> list:
    """The public hosts a piece of test source names (URLs and IPv4 literals)."""
    found = [m.group(1) for m in _URL.finditer(source) if not _loopback_host(m.group(1))]
    for m in _IPV4.finditer(source):
        try:
            ip = ipaddress.ip_address(m.group(1))
        except ValueError:
            continue
        if not (ip.is_loopback or ip.is_unspecified or ip.is_private):
            found.append(m.group(1))
    return found


def _addr_ok(family, address) -> bool:
    if family not in (socket.AF_INET, socket.AF_INET6):
        return True
    try:
        return ipaddress.ip_address(address[0].split("%")[0]).is_loopback
    except (ValueError, IndexError, TypeError, AttributeError):
        return False


_real_getaddrinfo = socket.getaddrinfo
_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _getaddrinfo(host, *args, **kwargs):
    name = host.decode() if isinstance(host, bytes) else host
    if name is not None and not _loopback_host(str(name)):
        raise PermissionError(f"e2b-suites: resolving {name!r} refused: only loopback is reachable")
    # A `*.localhost` name is loopback (RFC 6761), as browsers, curl and the JavaScript
    # guard answer it without asking DNS: get_host's `<port>-<id>.localhost`.
    if name is not None and str(name).lower().rstrip(".").endswith(".localhost"):
        return _real_getaddrinfo("127.0.0.1", *args, **kwargs)
    return _real_getaddrinfo(host, *args, **kwargs)


def _connect(self, address):
    if not _addr_ok(self.family, address):
        raise PermissionError(f"e2b-suites: connecting to {address!r} refused: loopback only")
    return _real_connect(self, address)


def _connect_ex(self, address):
    if not _addr_ok(self.family, address):
        raise PermissionError(f"e2b-suites: connecting to {address!r} refused: loopback only")
    return _real_connect_ex(self, address)


def pytest_configure(config):
    socket.getaddrinfo = _getaddrinfo
    socket.socket.connect = _connect
    socket.socket.connect_ex = _connect_ex


def pytest_collection_modifyitems(session, config, items):
    keep, dropped = [], []
    for item in items:
        try:
            src = inspect.getsource(item.function)
        except (OSError, TypeError, AttributeError):
            src = ""
        hosts = public_hosts(src)
        if hosts:
            dropped.append(item)
            print(f"E2B-SUITES-DESELECTED {item.nodeid} names a public host: {hosts[0]}")
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep

