#!/usr/bin/env python3
"""Turn a `pip install --dry-run --report` JSON into a hashed lock and a list of wheel files.

    lock_from_report.py REPORT LOCK FILES

LOCK gets `name==version --hash=sha256:...` lines (for pip --require-hashes --no-deps);
FILES gets the wheel file names, one a line, so a cache can be checked without pip.
"""

from __future__ import annotations

import json
import sys
from urllib.parse import unquote


def sha256_of(download_info: dict[str, object]) -> str:
    archive = download_info["archive_info"]
    assert isinstance(archive, dict)
    hashes = archive.get("hashes") or {}
    if "sha256" in hashes:
        return str(hashes["sha256"])
    algorithm, _, value = str(archive.get("hash", "")).partition("=")
    if algorithm != "sha256":
        raise SystemExit(f"lock_from_report: no sha256 for {download_info.get('url')}")
    return value


def main(report_path: str, lock_path: str, files_path: str) -> None:
    with open(report_path) as f:
        report = json.load(f)
    items = sorted(report["install"], key=lambda item: item["metadata"]["name"].lower())
    lock = ["# Resolved by hack/images/wheels.sh; pip install --require-hashes --no-deps -r <this>"]
    files = []
    for item in items:
        meta, info = item["metadata"], item["download_info"]
        lock.append(f"{meta['name']}=={meta['version']} --hash=sha256:{sha256_of(info)}")
        files.append(unquote(info["url"].rsplit("/", 1)[-1]))
    with open(lock_path, "w") as f:
        f.write("\n".join(lock) + "\n")
    with open(files_path, "w") as f:
        f.write("\n".join(files) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
