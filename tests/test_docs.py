"""Docs that run: every fenced shell and Python block of README.md and docs/*.md, as written.

Each page runs in a fresh folder holding links to the repository's tracked top-level entries
(so ``src/...`` and ``benchmarks/...`` resolve and what a block writes stays in the folder),
with ``$SHARED_DIR`` set and the environment's ``bin`` first on PATH. A page's blocks run in
order and share the folder, as a reader typing them would.

Markers (an HTML comment on the line before a fence):
- ``<!-- skip-test: why -->``: not run (long jobs, other machines); the reason is required.
Blocks are chosen by their language: ``bash``/``sh``/``shell`` run whole under
``bash -euo pipefail``; ``console`` runs its ``$ `` lines; ``python`` runs under this
interpreter; ``toml`` and ``json`` are parsed; ``text`` is shown output. A fence without a
language fails the test, so no command escapes it. A block that uses ``$SHARED_DIR`` is
skipped, with the reason, where the shared folder is absent; so is a later block of its page
that then fails, as it may read what the skipped one wrote (where the folder is present,
every block must pass).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardmeter.paths import missing_shared_reason, shared_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell"}
KNOWN = SHELL | {"console", "python", "toml", "json", "text"}
FENCE = re.compile(r"^```(?P<lang>[^\n`]*)\n(?P<body>.*?)^```\s*$", re.M | re.S)
SKIP = re.compile(r"<!--\s*skip-test:\s*(?P<why>[^>]*?)\s*-->\s*$")
BLOCK_TIMEOUT_S = 300
# The pages run once, two at a time, in the first test's fixture: a couple of minutes on two
# idle cores, longer on a loaded machine; each block still stops at BLOCK_TIMEOUT_S.
pytestmark = [pytest.mark.timeout(1800), pytest.mark.slow]  # every page runs: minutes


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    body: str
    skip: str | None  # the marker's reason

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, with the skip marker right above each."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = SKIP.search(before)
        out.append(
            Block(page, line, m["lang"].strip(), m["body"], marker["why"] if marker else None)
        )
    return out


def sandbox(tmp: Path) -> Path:
    """A folder with links to the tracked top-level entries of the repository."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.split()
    tops = {p.split("/", 1)[0] for p in tracked} or {"src", "benchmarks", "docs"}
    for name in sorted(tops):
        if (REPO / name).exists():
            (tmp / name).symlink_to(REPO / name)
    return tmp


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["SHARED_DIR"] = str(shared_dir())
    env["COLUMNS"] = "80"
    env.setdefault("MPLBACKEND", "Agg")
    return env


def command(block: Block) -> list[str] | None:
    """The command that runs a block, or None for blocks that are only checked or shown."""
    if block.lang in SHELL:
        return ["bash", "-euo", "pipefail", "-c", block.body]
    if block.lang == "console":
        lines = [ln[2:] for ln in block.body.splitlines() if ln.startswith("$ ")]
        return ["bash", "-euo", "pipefail", "-c", "\n".join(lines)]
    if block.lang == "python":
        return [sys.executable, "-c", block.body]
    return None


def check_data(block: Block) -> None:
    if block.lang == "toml":
        tomllib.loads(block.body)
    elif block.lang == "json":
        json.loads(block.body)


def test_every_fence_names_its_language() -> None:
    """A fence without a known language could hide a command the runner never runs."""
    bad = [f"{b.where} ({b.lang!r})" for p in PAGES for b in blocks(p) if b.lang not in KNOWN]
    assert not bad, f"fences need one of {sorted(KNOWN)}: {bad}"


def test_skips_say_why() -> None:
    empty = [b.where for p in PAGES for b in blocks(p) if b.skip is not None and not b.skip]
    assert not empty


@dataclass(frozen=True)
class PageRun:
    """What running one page's blocks gave: the first failure, or the blocks skipped."""

    failure: str | None
    skipped: tuple[str, ...]


def run_page(page: Path, tmp: Path) -> PageRun:
    """Run a page's blocks in order in a fresh sandbox; stop at the first failure."""
    folder = sandbox(tmp)
    env = environment()
    shared_ok = shared_dir().is_dir()
    skipped: list[str] = []
    for block in blocks(page):
        if block.lang not in KNOWN or block.skip is not None:
            continue
        try:
            check_data(block)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            return PageRun(f"{block.where}: invalid {block.lang}: {exc}", ())
        cmd = command(block)
        if cmd is None:
            continue
        if "SHARED_DIR" in block.body and not shared_ok:
            skipped.append(block.where)
            continue
        try:
            done = subprocess.run(
                cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            return PageRun(f"{block.where} ran past {BLOCK_TIMEOUT_S} s", ())
        if (done.returncode != 0 or "Traceback" in done.stderr) and skipped:
            skipped.append(f"{block.where} (after {skipped[0]}, whose output it may read)")
            continue
        if done.returncode != 0 or "Traceback" in done.stderr:
            return PageRun(
                f"{block.where} exited {done.returncode}\n--- stdout\n{done.stdout[-3000:]}"
                f"\n--- stderr\n{done.stderr[-3000:]}",
                (),
            )
    return PageRun(None, tuple(skipped))


@pytest.fixture(scope="module")
def page_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, PageRun]:
    """Every page run, two at a time: much of a page's time is processes waiting on each
    other (a launched server and its paced workers), which the other page's work fills."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            page: pool.submit(run_page, page, tmp_path_factory.mktemp(page.stem)) for page in PAGES
        }
        return {page: future.result() for page, future in futures.items()}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_page_runs_as_written(page: Path, page_runs: dict[Path, PageRun]) -> None:
    result = page_runs[page]
    assert result.failure is None, result.failure
    if result.skipped:
        pytest.skip(f"{', '.join(result.skipped)}: {missing_shared_reason('')}")


def test_a_block_that_needs_a_skipped_one_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the shared folder, a block that reads what a skipped block wrote is skipped
    with it (a fresh clone beside no ``../shared`` failed on docs/heloco.md); a block that
    needs nothing of it still runs."""
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    page = repo / "docs" / "page.md"
    page.write_text(
        "```bash\nmkdir out && ls $SHARED_DIR > out/listing\n```\n\n"
        "```bash\ncat out/listing\n```\n\n"
        "```bash\ntouch ran\n```\n",
        encoding="utf-8",
    )
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "REPO", repo)
    monkeypatch.setattr(module, "shared_dir", lambda: tmp_path / "absent")
    (tmp_path / "run").mkdir()
    result = run_page(page, tmp_path / "run")
    assert result.failure is None, result.failure
    assert result.skipped[0] == "docs/page.md:1" and result.skipped[1].startswith("docs/page.md:5")
    assert (tmp_path / "run" / "ran").exists()
