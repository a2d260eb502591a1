"""The SDK against a real `cordon serve`: runs, sandboxes, streaming, files, errors, a
bounded loopback load test and a kill -9 crash test."""

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from cordon_sandbox import (Cordon, CordonError, InvalidRequest, NotFound, PathRefused, PolicyDenied, StreamEvent,
                    Unauthorized)
from conftest import KEYS, ServerProc, cordon_bin

CGROUP = Path("/sys/fs/cgroup/memory/cordon")
if not CGROUP.exists():
    CGROUP = Path("/sys/fs/cgroup/cordon")


def cgroups(ids=None):
    names = {p.name for p in CGROUP.glob("sb-*")} if CGROUP.exists() else set()
    return names if ids is None else names & set(ids)


def test_run_python_in_wasm(alice):
    r = alice.run("print(6*7)", lang="python", tier="wasm")
    assert r.ok and r.stdout == "42\n" and r.tier == "wasm"


def test_run_timeout_is_an_outcome(alice):
    r = alice.run("while True: pass", lang="python", tier="wasm", timeout="300ms")
    assert r.termination == "timeout" and not r.ok


def test_wasm_sandbox_files_and_stream(alice):
    with alice.sandbox(tier="wasm", ttl="1m") as sb:
        sb.write_file("/work/a.csv", b"x\n1\n2\n")
        r = sb.exec("print(sum(1 for _ in open('/work/a.csv')))", lang="python")
        assert r.stdout == "3\n", r
        events = list(sb.exec_stream("import sys; print('out'); print('err', file=sys.stderr)",
                                     lang="python"))
        assert events[-1].type == "outcome" and events[-1].outcome.ok
        assert "".join(e.data for e in events if e.type == "stdout") == "out\n"
        assert "".join(e.data for e in events if e.type == "stderr") == "err\n"
        assert sb.read_file("/work/a.csv") == b"x\n1\n2\n"
        assert [s.id for s in alice.list_sandboxes()] == [sb.id]
    assert alice.list_sandboxes() == []
    sb.destroy()  # idempotent


def test_errors_map_to_exceptions(alice, bob, server):
    with pytest.raises(Unauthorized):
        Cordon(server.url, api_key="wrong").list_sandboxes()
    with alice.sandbox(tier="wasm") as sb:
        # This test's own file put and exec: the audit check below needs no other test's rows.
        sb.write_file("/work/mine", b"1")
        assert sb.exec("print(open('/work/mine').read())", lang="python").stdout == "1\n"
        with pytest.raises(NotFound):
            Cordon(server.url, api_key=KEYS["bob"]).__class__(server.url, KEYS["bob"]) \
                .request("GET", f"/v1/sandboxes/{sb.id}")
        with pytest.raises(PathRefused):
            sb.read_file("/proc/self/environ")
        with pytest.raises(PathRefused):
            sb.write_file("/work/../proc/x", b"no")
    with pytest.raises(InvalidRequest):
        alice.request("POST", "/v1/sandboxes", {"tier": "wasm", "privileged": True})
    with pytest.raises(PolicyDenied):
        alice.create_sandbox(tier="wasm", allow_hosts=["example.test"])
    assert not [e for e in bob.audit() if e.tenant == "alice"]
    kinds = {e.kind for e in alice.audit(sandbox=sb.id, limit=1000)}
    assert {"create", "exec", "file_put", "destroy"} <= kinds, kinds
    # The refusal above is a policy row of alice's too.
    rows, after = [], 0
    for _ in range(100):  # pages of 1000, oldest first
        page = alice.audit(kind="policy", after_id=after, limit=1000)
        if not page:
            break
        rows += page
        after = page[-1].id
    refusals = [e for e in rows if e.decision == "deny"
                and "example.test" in json.dumps(e.detail)]
    assert refusals, "the policy refusal was not audited"


def test_container_sandbox_example(alice, has_container):
    if not has_container:
        pytest.skip("container tier unavailable")
    with alice.sandbox(tier="container", ttl="10m") as sb:
        sb.write_file("/work/a.csv", b"x\n1\n2\n")
        events = list(sb.exec_stream(
            "python3 -c 'import csv; print(sum(1 for _ in open(\"/work/a.csv\")))'"))
        assert isinstance(events[-1], StreamEvent) and events[-1].outcome.ok, events
        assert "".join(e.data for e in events if e.type == "stdout") == "3\n"
        assert sb.read_file("/work/a.csv") == b"x\n1\n2\n"
        ids = [sb.id]
    assert cgroups(ids) == set(), "the sandbox's cgroup outlived it"


def _load(client: Cordon, tier: str, clients: int, rounds: int, errors: list, done: list,
          stop: "threading.Event | None" = None):
    """`clients` threads each do `rounds` rounds, or, with `stop`, rounds until it is set."""
    def worker(n: int) -> None:
        i = 0
        while (i < rounds) if stop is None else not stop.is_set():
            i += 1
            token = f"tok-{n}-{i}-{os.urandom(4).hex()}"
            try:
                with client.sandbox(tier=tier, ttl="2m") as sb:
                    sb.write_file("/work/t", token.encode())
                    if tier == "wasm":
                        r = sb.exec(f"print(open('/work/t').read() + ' {token}')", lang="python")
                    else:
                        r = sb.exec(f"cat /work/t; echo ' {token}'")
                    if r.stdout != f"{token} {token}\n":
                        errors.append(f"crossed or lost output: {r.stdout!r} != {token!r}")
                    done.append(sb.id)
            except Exception as e:  # noqa: BLE001 - every failure is a finding
                errors.append(repr(e))
    ts = [threading.Thread(target=worker, args=(n,)) for n in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300)


@pytest.mark.parametrize("tier", ["wasm", "container"])
def test_load_no_lost_or_crossed_outputs_no_leaks(alice, has_container, server, tier):
    if tier == "container" and not has_container:
        pytest.skip("container tier unavailable")
    errors, done = [], []
    _load(alice, tier, clients=6, rounds=5, errors=errors, done=done)
    assert errors == []
    assert len(done) == 30 and len(set(done)) == 30
    assert alice.list_sandboxes() == []
    assert cgroups(done) == set(), "leaked cgroups"
    scratch = server.data_dir / "scratch" / "wasm"
    # Only the warm pool's fresh sandboxes keep scratch dirs.
    deadline = time.time() + 10
    while len(list(scratch.iterdir())) > 1 and time.time() < deadline:
        time.sleep(0.1)
    assert len(list(scratch.iterdir())) <= 1, list(scratch.iterdir())


def test_kill9_then_restart_cleans_orphans_and_keeps_audit(has_container):
    tier = "container" if has_container else "wasm"
    top = Path(tempfile.mkdtemp(prefix="cordon-crash-"))
    d = top / "data"
    s = ServerProc(d, {tier: 2}).start()
    c = Cordon(s.url, KEYS["alice"])
    ids = [c.create_sandbox(tier=tier).id for _ in range(3)]
    errors, done, stop = [], [], threading.Event()
    t = threading.Thread(target=_load, args=(c, tier, 3, 0, errors, done, stop))
    t.start()
    # Kill once the load is under way (it runs until told to stop, however fast the host).
    deadline = time.time() + 60
    while len(done) < 6 and not errors and time.time() < deadline:
        time.sleep(0.01)
    assert len(done) >= 6 and not errors, f"the load did not get going: {errors}"
    s.kill9()
    # The workers keep going, so each meets the dead server; stop them once one has.
    deadline = time.time() + 30
    while not errors and time.time() < deadline:
        time.sleep(0.01)
    stop.set()
    t.join(timeout=120)
    assert not t.is_alive(), "the load threads did not stop"
    assert errors, "the load was meant to be cut off by the kill"
    if tier == "container":
        assert cgroups(ids) == set(ids), "the dead server's sandboxes should still be there"
    else:
        assert len(list((d / "scratch" / "wasm").iterdir())) >= 3
    s2 = ServerProc(d, {tier: 2}).start()
    try:
        if tier == "container":
            assert cgroups(ids) == set(), "orphaned cgroups survived the restart"
        out = subprocess.run([cordon_bin(), "audit", "--data-dir", str(d), "--kind", "recovery",
                              "--json"], capture_output=True, text=True, check=True).stdout
        assert all(i in out for i in ids), out
        creates = subprocess.run([cordon_bin(), "audit", "--data-dir", str(d), "--tenant",
                                  "alice", "--kind", "create", "--limit", "1000", "--json"],
                                 capture_output=True, text=True, check=True).stdout
        assert all(i in creates for i in ids)
        c2 = Cordon(s2.url, KEYS["alice"])
        assert c2.list_sandboxes() == []
        assert c2.run("print(1)", tier="wasm").stdout == "1\n"
    finally:
        s2.stop()
        shutil.rmtree(top, ignore_errors=True)


def test_tier_policy_picks_and_refuses(alice):
    # Untrusted pure computation: the policy allows wasm (no host kernel surface) and, with
    # tier auto, picks an allowed tier this server has.
    r = alice.run("print(6*7)", lang="python", tier="auto", trust="untrusted",
                  autonomy="compute")
    assert r.ok and r.stdout == "42\n" and r.tier in ("wasm", "gvisor", "microvm"), r
    # Untrusted work in a container (a shared kernel) is below the minimum: refused, and the
    # error names the rule and the fix.
    with pytest.raises(PolicyDenied) as e:
        alice.create_sandbox(tier="container", trust="untrusted", autonomy="compute")
    assert "untrusted-needs-kernel-boundary" in str(e.value)
    denials = [ev for ev in alice.audit(kind="policy", limit=1000)
               if ev.decision == "deny"]
    assert any("untrusted-needs-kernel-boundary" in json.dumps(ev.detail) for ev in denials)


def test_destroy_ends_a_running_exec_at_once(alice, has_container):
    if not has_container:
        pytest.skip("container tier unavailable here (see the SKIPPING line above)")
    sb = alice.create_sandbox(tier="container", ttl="5m")
    seen = {}

    def run():
        try:
            seen["result"] = sb.exec("sleep 60", timeout="60s")
        except CordonError as e:
            seen["error"] = e

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    sb.destroy()
    took = time.monotonic() - t0
    t.join(10)
    assert not t.is_alive(), "the exec is still running after destroy"
    assert took < 5, f"destroy waited {took:.1f} s for the running exec"
    # The exec did not run to its end: it was ended by the destroy.
    assert "error" in seen or seen["result"].termination != "exited", seen
    assert cgroups([sb.id]) == set(), "the sandbox's cgroup survived destroy"


def _oci_image(path: Path) -> None:
    """Writes a one-layer OCI image layout tar: the host's static busybox as /bin/sh and
    /bin/cat, a file, and an image environment."""
    import hashlib
    import io
    import tarfile

    def add(tar: tarfile.TarFile, name: str, data: bytes = b"", mode: int = 0o644,
            kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.size, info.linkname = kind, mode, len(data), link
        tar.addfile(info, io.BytesIO(data))

    def tar_bytes(fill) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
            fill(t)
        return buf.getvalue()

    def layer(t: tarfile.TarFile) -> None:
        add(t, "bin", kind=tarfile.DIRTYPE, mode=0o755)
        add(t, "bin/busybox", Path("/bin/busybox").read_bytes(), 0o755)
        for applet in ("sh", "cat"):
            add(t, f"bin/{applet}", kind=tarfile.SYMTYPE, link="busybox")
        add(t, "greeting.txt", b"hello from the template\n")

    def digest(b: bytes) -> str:
        return "sha256:" + hashlib.sha256(b).hexdigest()

    lay = tar_bytes(layer)
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Env": ["PATH=/bin", "GREETING=from-the-image"]},
                         "rootfs": {"type": "layers", "diff_ids": [digest(lay)]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digest(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": digest(lay), "size": len(lay)}]}).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json",
         "digest": digest(manifest), "size": len(manifest)}]}).encode()

    def outer(t: tarfile.TarFile) -> None:
        add(t, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add(t, "index.json", index)
        for blob in (manifest, config, lay):
            add(t, "blobs/sha256/" + digest(blob)[7:], blob)

    path.write_bytes(tar_bytes(outer))


def test_template_run_and_sandbox(alice, server, has_container):
    """`template=` in run and create: the sandbox's root is the template's, its image
    environment the default one; the audit record names the template and its digest."""
    if not has_container:
        pytest.skip("container tier unavailable")
    if not Path("/bin/busybox").exists():
        if os.environ.get("CORDON_REQUIRE_ALL") == "1":
            pytest.fail("no /bin/busybox (apt-get install busybox-static) and CORDON_REQUIRE_ALL=1")
        pytest.skip("no /bin/busybox (apt-get install busybox-static)")
    image = server.data_dir.parent / "image.oci.tar"
    _oci_image(image)
    out = subprocess.run([cordon_bin(), "template", "import", str(image), "--name", "bb",
                          "--data-dir", str(server.data_dir)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # As /var/lib/cordon: the sandbox's ids may pass through the data dir to the root.
    for d in (server.data_dir.parent, server.data_dir):
        os.chmod(d, 0o711)
    r = alice.run(["cat", "/greeting.txt"], None, tier="container", template="bb")
    assert r.stdout == "hello from the template\n", r
    with alice.sandbox(tier="container", template="bb") as sb:
        assert sb.exec("echo $GREETING $HOME").stdout == "from-the-image /work\n"
    # Every policy row of this tenant: a page holds at most 1000, oldest first, and the
    # session's earlier tests wrote many.
    events, after = [], None
    for _ in range(100):
        page = alice.audit(kind="policy", after_id=after, limit=1000)
        if not page:
            break
        events += page
        after = page[-1].id
    rows = [e.detail.get("template") for e in events]
    named = [t for t in rows if t]
    assert len(named) == 2 and all(t["name"] == "bb" and t["digest"].startswith("sha256:")
                                   for t in named), rows


def test_directory_tar_round_trip_and_file_calls(alice, bob, has_container, tmp_path):
    src = tmp_path / "src"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha\n")
    big = bytes(range(256)) * 4096  # 1 MiB
    (src / "big.bin").write_bytes(big)
    (src / "pkg" / "sub" / "deep.txt").write_text("deep\n")
    os.chmod(src / "pkg" / "sub" / "deep.txt", 0o600)
    os.symlink("/etc/passwd", src / "link")
    # A long non-ASCII name: tarfile writes it as a pax record.
    long_name = "é" * 80 + ".txt"
    (src / "pkg" / long_name).write_text("pax\n")
    tiers = ["wasm"] + (["container"] if has_container else [])
    for tier in tiers:
        with alice.sandbox(tier=tier, ttl="2m") as sb:
            rep = sb.files.upload_dir(src, "/work/proj")
            assert (rep.files, rep.dirs, rep.bytes) == (4, 2, len(big) + 15), rep
            # The symlink was not extracted: it is reported.
            assert [p for p, _ in rep.skipped] == ["/work/proj/link"], rep
            assert [(e.name, e.kind) for e in sb.files.list("/work/proj")] == [
                ("a.txt", "file"), ("big.bin", "file"), ("pkg", "dir")]
            st = sb.files.stat("/work/proj/pkg/sub/deep.txt")
            assert (st.kind, st.size, st.mode) == ("file", 5, 0o600), st
            sb.files.mkdir("/work/out/x", parents=True)
            sb.files.rename("/work/proj/a.txt", "/work/out/x/a.txt")
            # The program sees what the calls did.
            if tier == "wasm":
                r = sb.exec("print(open('/work/out/x/a.txt').read(), end='')", lang="python")
            else:
                r = sb.exec("cat /work/out/x/a.txt")
            assert r.stdout == "alpha\n", r
            out = tmp_path / f"out-{tier}"
            assert sb.files.download_dir("/work", out) == []
            assert (out / "proj" / "big.bin").read_bytes() == big
            assert (out / "proj" / "pkg" / "sub" / "deep.txt").read_text() == "deep\n"
            assert (out / "proj" / "pkg" / long_name).read_text() == "pax\n"
            assert (out / "out" / "x" / "a.txt").read_text() == "alpha\n"
            assert not (out / "proj" / "link").exists()
            sb.files.remove("/work/proj", recursive=True)
            assert [e.name for e in sb.files.list()] == ["out"]
            # Outside /work: the kernel's files are refused on every tier (a tier that
            # serves files outside the workspace reaches the sandbox's own, ADR 0031).
            with pytest.raises(PathRefused):
                sb.files.list("/proc")
            with pytest.raises(NotFound):
                bob.sandbox_handle(sb.id).files.list()
            with pytest.raises(NotFound):
                bob.sandbox_handle(sb.id).files.download_dir("/work", tmp_path / "bob")
            assert not (tmp_path / "bob").exists() or not any((tmp_path / "bob").iterdir())
