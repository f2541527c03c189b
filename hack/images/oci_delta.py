#!/usr/bin/env python3
"""Rewrite a docker-archive as an OCI archive that leaves out the layers a containerd has.

    oci_delta.py ARCHIVE HAVE OUT

HAVE lists the content digests the target containerd already stores (`ctr content ls -q`).
OUT gets an OCI image layout (index.json names the image through `io.containerd.image.name`)
with the config, the manifest and only the missing layers, so importing a rebuilt worker image
moves its few new small layers instead of the whole 1.4 GB. Layers stay uncompressed, so a
layer's digest is its diff ID, the same one a docker-archive import stores. Prints the number of
bytes left out. If the target turns out to lack a blob after all, its import fails and the
caller imports the whole archive instead.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile

LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def add_bytes(out: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    out.addfile(info, io.BytesIO(data))


def blob_name(digest: str) -> str:
    return "blobs/sha256/" + digest.removeprefix("sha256:")


def main(archive: str, have_path: str, out_path: str) -> None:
    with open(have_path) as f:
        have = {line.strip() for line in f if line.strip()}
    with tarfile.open(archive) as src:
        entry = json.load(src.extractfile("manifest.json"))[0]  # type: ignore[arg-type]
        config = src.extractfile(entry["Config"]).read()  # type: ignore[union-attr]
        diff_ids = json.loads(config)["rootfs"]["diff_ids"]
        if len(diff_ids) != len(entry["Layers"]):
            raise SystemExit("oci_delta: layer count does not match the config's diff_ids")
        layers = []
        for diff_id, path in zip(diff_ids, entry["Layers"], strict=True):
            member = src.getmember(path)
            while member.issym() or member.islnk():  # docker-archive v1 paths link to blobs
                member = src.getmember(member.linkname.removeprefix("../").lstrip("/"))
            layers.append((diff_id, member))
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {
                "mediaType": CONFIG,
                "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
                "size": len(config),
            },
            "layers": [{"mediaType": LAYER, "digest": d, "size": m.size} for d, m in layers],
        }
        manifest_bytes = json.dumps(manifest, separators=(",", ":")).encode()
        manifest_digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": MANIFEST,
                    "digest": manifest_digest,
                    "size": len(manifest_bytes),
                    "annotations": {"io.containerd.image.name": entry["RepoTags"][0]},
                }
            ],
        }
        skipped = 0
        with tarfile.open(out_path, "w") as out:
            add_bytes(out, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
            add_bytes(out, "index.json", json.dumps(index).encode())
            add_bytes(out, blob_name(manifest_digest), manifest_bytes)
            add_bytes(out, blob_name(manifest["config"]["digest"]), config)  # type: ignore[index]
            written = set()
            for diff_id, member in layers:
                if diff_id in have or diff_id in written:
                    skipped += member.size if diff_id in have else 0
                    continue
                info = tarfile.TarInfo(blob_name(diff_id))
                info.size = member.size
                info.mode = 0o644
                out.addfile(info, src.extractfile(member))
                written.add(diff_id)
    print(skipped)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
