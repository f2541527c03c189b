"""What README.md and the pages of docs/ tell a user to run must exist: every `make TARGET` they
show resolves in the Makefile (`make -n` succeeds), and every repository path they name
(scripts, examples, docs) is there. Each page is read as a user reads it: code blocks and inline
code spans. Every page of docs/ is in mkdocs.yml's nav (MkDocs in strict mode, run by
`make verify`, checks the links between them)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from tests.cluster import REPO

PAGES = {path.relative_to(REPO).as_posix(): path.read_text()
         for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]}
README = PAGES["README.md"]
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")
MAKE = re.compile(r"(?<![\w-])make((?:\s+[a-z][a-z0-9-]*|\s+[A-Z_]+=[^\s`|]+)+)")
TOP_DIRS = ("hack", "tests", "examples", "charts", "crds", "docs", "images", "operator")
PATH = re.compile(rf"(?<![\w./~-])((?:{'|'.join(TOP_DIRS)})/[\w./-]*)")


def shown_as_code(text: str) -> list[str]:
    """The code a reader sees: fenced blocks, then inline spans of the prose around them."""
    blocks = FENCED.findall(text)
    prose = FENCED.sub("", text)
    return blocks + INLINE.findall(prose)


def make_commands(text: str) -> list[str]:
    """`make run`, `make test CLUSTER=kind`, ... as the argument strings after `make`."""
    found = []
    for code in shown_as_code(text):
        for line in code.splitlines():
            line = line.split("#", 1)[0]  # comments in code blocks are prose
            found += [m.group(1).strip() for m in MAKE.finditer(line)]
    return sorted(set(found))


def repo_paths(text: str) -> list[str]:
    paths = {p.rstrip(".") for p in PATH.findall(text)}
    return sorted(p for p in paths if "<" not in p)


def test_the_readme_shows_the_commands_users_start_with() -> None:
    commands = make_commands(README)
    assert {"run", "test", "venv"} <= set(commands)


def commands_in_pages() -> list[str]:
    return sorted({command for text in PAGES.values() for command in make_commands(text)})


def paths_in_pages() -> list[tuple[str, str]]:
    return [(page, path) for page, text in PAGES.items() for path in repo_paths(text)]


@pytest.mark.parametrize("command", commands_in_pages())
def test_every_make_command_in_the_readme_and_docs_resolves(command: str) -> None:
    make = shutil.which("make")
    assert make, "make is not installed"
    proc = subprocess.run([make, "-n", "-C", str(REPO), *command.split()], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, f"`make {command}` does not resolve:\n{proc.stderr}"


@pytest.mark.parametrize(("page", "path"), paths_in_pages())
def test_every_repository_path_in_the_readme_and_docs_exists(page: str, path: str) -> None:
    assert (REPO / path).exists(), f"{page} names {path}, which is not in the repository"


def test_the_readme_is_a_front_page_that_links_every_docs_page() -> None:
    assert len(README.splitlines()) <= 250, "README.md is the front page: move details to docs/"
    pages = [page for page in PAGES if page.startswith("docs/")]
    unlinked = [page for page in pages if f"]({page})" not in README]
    assert not unlinked, f"README.md links no {unlinked}"


def test_every_docs_page_is_in_the_site_nav() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs" and config["strict"] is True
    nav = [next(iter(entry.values())) for entry in config["nav"]]
    pages = sorted(page.removeprefix("docs/") for page in PAGES if page.startswith("docs/"))
    assert sorted(nav) == pages


def test_the_extraction_finds_what_it_should() -> None:
    text = (
        "```bash\nmake run   # not `make hidden` in a comment\n```\n"
        "| `make test-e2e CLUSTER=kind` | `hack/run.sh` and /opt/x/hack/no.sh |\n"
        "prose: make nothing here; see [c](docs/contracts.md).\n"
    )
    assert make_commands(text) == ["run", "test-e2e CLUSTER=kind"]
    assert repo_paths(text) == ["docs/contracts.md", "hack/run.sh"]
