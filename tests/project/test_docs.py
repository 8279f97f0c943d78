"""The docs: the reference in docs/ builds with `mkdocs build --strict` (no broken link or
anchor), and the README stays a newcomer's page: at most 400 lines, every relative link live."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import markdown
import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 400
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _anchors(page: Path) -> set[str]:
    """The ids MkDocs gives the page's headings (the same toc extension renders them)."""
    md = markdown.Markdown(extensions=["toc", "tables", "fenced_code"])
    md.convert(page.read_text(encoding="utf-8"))
    ids: set[str] = set()
    stack = list(md.toc_tokens)  # type: ignore[attr-defined]
    while stack:
        token = stack.pop()
        ids.add(token["id"])
        stack.extend(token["children"])
    return ids


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Every relative link of `page` whose file, or whose anchor in that file, is missing
    (paths shown relative to `root`)."""
    problems = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto: are not this repository's to check
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            problems.append(f"{target}: no file {file.relative_to(root)}")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            problems.append(f"{target}: no heading #{anchor} in {file.relative_to(root)}")
    return problems


def test_the_docs_build_strictly_without_a_warning(tmp_path: Path) -> None:
    """`mkdocs build --strict` of docs/ succeeds and prints no warning (links and anchors checked)."""
    done = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "WARNING" not in output, output
    assert (tmp_path / "site" / "commands" / "index.html").exists()


def test_the_strict_build_fails_on_a_broken_anchor(tmp_path: Path) -> None:
    """The build the test above runs is one that can fail: a link to a missing anchor aborts it."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with (tmp_path / "docs" / "index.md").open("a", encoding="utf-8") as index:
        index.write("\nSee [nothing](commands.md#no-such-heading).\n")
    done = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-heading" in done.stdout + done.stderr


def readme_setup_commands() -> list[str]:
    """The bash blocks of the README's "Set up" section: the run command, the test command."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_the_readme_installs_only_what_running_needs_and_the_test_extra_to_test() -> None:
    """The run command installs loadgen alone (it installed the test extra: Ray, mypy, ...,
    an 837 MB venv for a first run; 420 MB without); the test command installs the test
    extra, and `.ci/run` installs it and runs that same test command."""
    run, test = readme_setup_commands()
    assert "pip install -e . &&" in run
    assert "[test]" not in run
    assert "loadgen run workloads/" in run
    install, command = test.split(" && ")
    assert install == "pip install -e '.[test]'"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "python -m pip install --quiet -e '.[test]'" in ci
    assert any(line.startswith(command + " ") for line in ci), command


def test_a_docs_build_as_documented_leaves_nothing_untracked() -> None:
    """`mkdocs build --strict` at the root, as the README says, writes site/: git ignores it
    (it was left untracked), as it ignores the rolling view's default folder."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for path in ("site/index.html", "rolling-report/rolling.html"):
        done = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, check=False)
        assert done.returncode == 0, f"{path} is not ignored by git"


def test_the_readme_is_at_most_400_lines() -> None:
    """README.md is a newcomer's page; the reference belongs in docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_every_relative_link_of_the_readme_resolves() -> None:
    """Each README link to a repository file exists, and each anchor names a heading there."""
    assert broken_links(ROOT / "README.md") == []


def test_the_link_check_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    """The README's link check can fail: it names a missing page and a missing heading."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## A heading\n", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md#a-heading) [gone](docs/b.md) [bad](docs/a.md#no-heading) "
        "[web](https://example.com/x#y)\n",
        encoding="utf-8",
    )
    problems = [p.split(":")[0] for p in broken_links(page, tmp_path)]
    assert problems == ["docs/b.md", "docs/a.md#no-heading"]
