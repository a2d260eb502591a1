#!/usr/bin/env python3
"""Writes a one-layer OCI image archive from files on this machine, for the test cluster
(scripts/k8s.sh imports it with `ctr images import`; no registry is reachable or used).

    scripts/k8s/image.py OUT.tar NAME [--entrypoint ARG]... [--cmd ARG]... [--env K=V]...
        [--file DEST=SRC]... [--link DEST=TARGET]... [--dir DEST]...

NAME is the image's name in containerd (cordon.local/NAME:TAG). Files keep their mode and are
owned by 0:0; the layer and archive are the same bytes for the same inputs (times are 0).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path


def layer(files: list[str], links: list[str], dirs: list[str]) -> bytes:
    buf = io.BytesIO()
    entries: dict[str, tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]] = {}

    def parents(dest: str) -> None:
        parts = dest.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in entries:
                ti = tarfile.TarInfo(d)
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                entries[d] = ti

    for d in dirs:
        parents(d + "/x")
    for spec in files:
        dest, _, src = spec.partition("=")
        data = Path(src).read_bytes()
        parents(dest)
        ti = tarfile.TarInfo(dest.strip("/"))
        ti.size, ti.mode = len(data), Path(src).stat().st_mode & 0o7777
        entries[ti.name] = (ti, data)
    for spec in links:
        dest, _, target = spec.partition("=")
        parents(dest)
        ti = tarfile.TarInfo(dest.strip("/"))
        ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, target, 0o777
        entries[ti.name] = ti
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            e = entries[name]
            if isinstance(e, tuple):
                tar.addfile(e[0], io.BytesIO(e[1]))
            else:
                tar.addfile(e)
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("name")
    ap.add_argument("--entrypoint", action="append", default=[])
    ap.add_argument("--cmd", action="append", default=[])
    ap.add_argument("--env", action="append", default=["PATH=/bin:/usr/bin:/sbin:/usr/sbin"])
    ap.add_argument("--file", action="append", default=[])
    ap.add_argument("--link", action="append", default=[])
    ap.add_argument("--dir", action="append", default=[])
    a = ap.parse_args()

    tar = layer(a.file, a.link, a.dir)
    gz = gzip.compress(tar, mtime=0)
    diff_id = "sha256:" + hashlib.sha256(tar).hexdigest()
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> tuple[str, int]:
        d = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[d] = data
        return d, len(data)

    config = {
        "architecture": "amd64", "os": "linux",
        "config": {"Env": a.env, "Entrypoint": a.entrypoint or None, "Cmd": a.cmd or None},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    cdig, csize = blob(json.dumps(config, sort_keys=True).encode())
    ldig, lsize = blob(gz)
    manifest = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cdig, "size": csize},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": ldig, "size": lsize}],
    }
    mdig, msize = blob(json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdig, "size": msize,
            "annotations": {"io.containerd.image.name": a.name,
                            "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[-1]},
        }],
    }
    with tarfile.open(a.out, "w") as out:
        def add(name: str, data: bytes) -> None:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), 0o644
            out.addfile(ti, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index).encode())
        for d, data in sorted(blobs.items()):
            add("blobs/sha256/" + d.split(":", 1)[1], data)


if __name__ == "__main__":
    main()
