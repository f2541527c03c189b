"""Print the Python requirements of one image, one per line, read from operator/pyproject.toml.

    python3 requirements.py FLAVOR [PYPROJECT]

FLAVOR is `operator` (the package's dependencies), `worker` (its `worker` extra), `worker-gpu`
(the `worker` extra with tensorflow-cpu replaced by TensorFlow's own GPU build,
tensorflow[and-cuda], same version range) or `build` (the build-system requirements).
pyproject.toml stays the single source; this runs both inside image builds and on the host.
Standard library only (Python >= 3.11).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

TF_CPU = re.compile(r"^tensorflow-cpu(?=\s*(?:[<>=!~;@\[(]|$))", re.IGNORECASE)


def requirements(flavor: str, pyproject: dict[str, object]) -> list[str]:
    project = pyproject["project"]
    assert isinstance(project, dict)
    if flavor == "operator":
        return list(project.get("dependencies", []))
    if flavor == "build":
        build_system = pyproject.get("build-system", {})
        assert isinstance(build_system, dict)
        return list(build_system.get("requires", []))
    worker = list(project.get("optional-dependencies", {}).get("worker", []))
    if not worker:
        raise SystemExit("requirements: pyproject has no `worker` extra")
    if flavor == "worker":
        return worker
    if flavor == "worker-gpu":
        return [TF_CPU.sub("tensorflow[and-cuda]", req) for req in worker]
    raise SystemExit(
        f"requirements: unknown flavor {flavor!r} (operator, worker, worker-gpu, build)"
    )


def main(argv: list[str]) -> None:
    if len(argv) not in (2, 3):
        raise SystemExit(__doc__)
    default = Path(__file__).resolve().parents[2] / "operator" / "pyproject.toml"
    path = Path(argv[2]) if len(argv) == 3 else default
    with path.open("rb") as f:
        print("\n".join(requirements(argv[1], tomllib.load(f))))


if __name__ == "__main__":
    main(sys.argv)
