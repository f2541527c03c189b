#!/usr/bin/env python3
"""Write a single-layer docker-archive (what `docker save` writes) from a layer tarball.

    mkarchive.py --layer rootfs.tar --tag multiworker.local/pause:3.10 \
        --entrypoint '["/pause"]' [--cmd JSON] [--env K=V]... [--user U] [--workdir D] \
        [--label K=V]... --out pause.tar

The config is written with sorted keys and a fixed creation time, so the same layer and options
always give the same image ID. `ctr images import`, `buildah pull docker-archive:` and
`docker load` read the result.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

CREATED = "1970-01-01T00:00:00Z"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"mkarchive: {flag} {item!r} is not KEY=VALUE")
        out[key] = value
    return out


def image_config(args: argparse.Namespace, diff_id: str) -> dict[str, object]:
    config: dict[str, object] = {"Env": args.env}
    if args.entrypoint:
        config["Entrypoint"] = json.loads(args.entrypoint)
    if args.cmd:
        config["Cmd"] = json.loads(args.cmd)
    if args.user:
        config["User"] = args.user
    if args.workdir:
        config["WorkingDir"] = args.workdir
    if args.label:
        config["Labels"] = pairs(args.label, "--label")
    return {
        "architecture": args.arch,
        "os": "linux",
        "created": CREATED,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created": CREATED, "created_by": "hack/images/mkarchive.py"}],
    }


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_archive(args: argparse.Namespace) -> str:
    layer = Path(args.layer)
    diff_id = sha256_file(layer)
    config = json.dumps(image_config(args, diff_id), sort_keys=True, separators=(",", ":"))
    config_bytes = config.encode()
    config_id = hashlib.sha256(config_bytes).hexdigest()
    manifest = [
        {"Config": f"{config_id}.json", "RepoTags": [args.tag], "Layers": [f"{diff_id}.tar"]}
    ]
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tar.gettarinfo(str(layer), arcname=f"{diff_id}.tar")
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        with layer.open("rb") as f:
            tar.addfile(info, f)
        add_bytes(tar, f"{config_id}.json", config_bytes)
        add_bytes(tar, "manifest.json", json.dumps(manifest).encode())
    os.replace(tmp, out)
    return f"sha256:{config_id}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer", required=True, help="uncompressed tar of the root filesystem")
    parser.add_argument("--tag", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--entrypoint", help="JSON list")
    parser.add_argument("--cmd", help="JSON list")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE")
    parser.add_argument("--label", action="append", default=[], help="KEY=VALUE")
    parser.add_argument("--user")
    parser.add_argument("--workdir")
    parser.add_argument("--arch", default="amd64")
    args = parser.parse_args()
    pairs(args.env, "--env")
    print(write_archive(args))


if __name__ == "__main__":
    main()
