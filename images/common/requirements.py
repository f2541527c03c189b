"""Print the Python requirements of one image, one per line, read from operator/pyproject.toml.

    python3 requirements.py FLAVOR [PYPROJECT]

FLAVOR is `operator` (the package's dependencies and its `operator` extra), `worker` (its `worker` extra), `worker-gpu`
(the `worker` extra with tensorflow-cpu replaced by TensorFlow's own GPU build,
tensorflow[and-cuda], same version range) or `build` (the build-system requirements). Both
worker flavors add tf-keras in TensorFlow's version range: Keras 2, which `model.fit` needs
under MultiWorkerMirroredStrategy (TF_USE_LEGACY_KERAS=1; docs/keras.md). tf-keras requires
`tensorflow`, which tensorflow-cpu provides under another name: the CPU lock leaves it out
(hack/images/locks.sh) and the images install without resolving.
pyproject.toml stays the single source; this runs both inside image builds and on the host.
Standard library only (Python >= 3.11).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

TF_CPU = re.compile(r"^tensorflow-cpu(?=\s*(?:[<>=!~;@\[(]|$))", re.IGNORECASE)
KERAS_2 = "tf-keras"


def requirements(flavor: str, pyproject: dict[str, object]) -> list[str]:
    project = pyproject["project"]
    assert isinstance(project, dict)
    if flavor == "operator":  # the client's dependencies and the operator's extra
        return list(project.get("dependencies", [])) + list(
            project.get("optional-dependencies", {}).get("operator", []))
    if flavor == "build":
        build_system = pyproject.get("build-system", {})
        assert isinstance(build_system, dict)
        return list(build_system.get("requires", []))
    worker = list(project.get("optional-dependencies", {}).get("worker", []))
    if not worker:
        raise SystemExit("requirements: pyproject has no `worker` extra")
    if flavor == "worker":
        return worker + keras_2(worker)
    if flavor == "worker-gpu":
        return [TF_CPU.sub("tensorflow[and-cuda]", req) for req in worker] + keras_2(worker)
    raise SystemExit(
        f"requirements: unknown flavor {flavor!r} (operator, worker, worker-gpu, build)"
    )


def keras_2(worker: list[str]) -> list[str]:
    """tf-keras with the version range of the extra's TensorFlow: tf-keras X.Y runs on
    TensorFlow X.Y only, and pip-compile picks the pair."""
    tf = next((req for req in worker if TF_CPU.match(req)), None)
    if tf is None:
        raise SystemExit("requirements: the `worker` extra has no tensorflow-cpu")
    return [TF_CPU.sub(KERAS_2, tf)]


def main(argv: list[str]) -> None:
    if len(argv) not in (2, 3):
        raise SystemExit(__doc__)
    default = Path(__file__).resolve().parents[2] / "operator" / "pyproject.toml"
    path = Path(argv[2]) if len(argv) == 3 else default
    with path.open("rb") as f:
        print("\n".join(requirements(argv[1], tomllib.load(f))))


if __name__ == "__main__":
    main(sys.argv)
