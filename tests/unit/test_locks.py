"""The images' committed wheel locks (images/<image>/requirements.txt, `make locks`): every
package pinned with `==` and sha256 hashes, the pins still satisfy operator/pyproject.toml, and
the image build installs exactly that file, hash-checked and without resolving anything."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.cluster import REPO

IMAGES = ("operator", "worker", "worker-gpu")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)$")
HASH = re.compile(r"^--hash=sha256:[0-9a-f]{64}$")


def entries(text: str) -> list[list[str]]:
    """The lock's requirement lines, continuation lines joined, comments dropped, as words."""
    joined = re.sub(r"\\\n", " ", text)
    lines = (line.split("#", 1)[0].strip() for line in joined.splitlines())
    return [line.split() for line in lines if line]


def pins(image: str) -> dict[str, str]:
    """name -> version of every entry, after checking its form."""
    found = {}
    for words in entries((REPO / "images" / image / "requirements.txt").read_text()):
        pin = PIN.match(words[0])
        assert pin, f"{image}: {words[0]!r} is not pinned with =="
        hashes = words[1:]
        assert hashes and all(HASH.match(h) for h in hashes), f"{image}: {words[0]} hashes"
        found[canonicalize_name(pin.group(1))] = pin.group(2)
    return found


@pytest.mark.parametrize("image", IMAGES)
def test_every_package_is_pinned_with_hashes(image: str) -> None:
    assert len(pins(image)) > 1


def test_a_lock_entry_without_hash_or_pin_fails() -> None:
    assert entries("a==1 \\\n    --hash=sha256:" + "0" * 64 + "\n# c\nb>=2\n") == [
        ["a==1", "--hash=sha256:" + "0" * 64], ["b>=2"]]
    assert not PIN.match("b>=2")


@pytest.mark.parametrize("image", IMAGES)
def test_the_lock_satisfies_pyproject(image: str) -> None:
    """pyproject.toml changed without `make locks`: the build would install something else."""
    script = REPO / "images" / "common" / "requirements.py"
    wanted = subprocess.run([sys.executable, str(script), image], capture_output=True,
                            text=True, check=True).stdout.split("\n")
    locked = pins(image)
    for line in filter(None, wanted):
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name in locked, f"{image}: {req} is not in the lock: run `make locks`"
        assert req.specifier.contains(locked[name], prereleases=True), (
            f"{image}: locked {name}=={locked[name]} does not satisfy {req}: run `make locks`")


@pytest.mark.parametrize("image", IMAGES)
def test_the_image_build_installs_the_committed_lock(image: str) -> None:
    dockerfile = (REPO / "images" / image / "Dockerfile").read_text()
    copy = re.search(rf"^COPY .*\bimages/{image}/requirements\.txt (\S+)$", dockerfile,
                     re.MULTILINE)
    assert copy, f"images/{image}/Dockerfile does not copy its lock"
    assert f"install-venv.sh deps {copy.group(1)}requirements.txt" in dockerfile
    ignore = (REPO / "images" / image / "Dockerfile.dockerignore").read_text().splitlines()
    assert f"!images/{image}/requirements.txt" in ignore
    wheels = (REPO / "hack" / "images" / "wheels.sh").read_text()
    assert 'lock=$repo/images/$flavor/requirements.txt' in wheels


def test_the_lock_is_installed_hash_checked_and_without_resolving() -> None:
    install = (REPO / "images" / "common" / "install-venv.sh").read_text()
    deps = install[install.index("deps() {"):install.index("\n}\n", install.index("deps() {"))]
    command = next(line for line in deps.splitlines() if "pip install" in line)
    assert "--require-hashes" in command and "--no-deps" in command and '-r "$lock"' in command
