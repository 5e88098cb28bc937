"""Every repository path the documentation names exists.

The pages checked are README.md and docs/*.md. docs/journal/ is left out: it
is the dated history of measurements and names files as they were then.

What counts as a repository path: a token that starts with one of this
repository's top-level entries (`TOP_DIRS` followed by ``/``, or one of
`TOP_FILES`), found

* in an inline code span (`` `harness/metrics.py` ``, or a command in one,
  `` `bash scripts/kernel_paths.sh` ``), in a fenced code block or an indented
  (4-space) code block: relative to the repository root;
* as a link target (``[text](fidelity.md)``): relative to the page, as a link
  is; a ``#anchor`` (``fidelity.md#rules``, or ``#rules`` on the page itself)
  must be one of that page's headings, as GitHub makes their anchors.

From each token a ``:line`` suffix (``harness/orgs/u0.py:120``), a ``#anchor``
and trailing punctuation are cut. Not paths of this repository, so skipped:

* a token preceded by ``/``, ``.``, ``~``, ``$``, ``:``, ``@``, ``-`` or a word
  character (``/tmp/base/harness/...``, ``~/.cache/hbench/...``): another
  directory's path; so ``repo:path`` names another project's file
  (``vllm-project/vllm:tests/v1/core/utils.py``);
* a pattern or placeholder: a token with ``*``, ``{``, ``<`` or ``...``, or a
  part in capitals (``tests/integration/ENGINE/``, ``OUT/``);
* an output a command writes: a missing path under results/ that git ignores
  (``results/*`` is ignored but for the committed results: baselines,
  fidelity ledgers, ...), e.g. ``--out results/capacity``. Committed results
  are checked like any other file.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TOP_DIRS = ("harness", "adapters", "analysis", "hbench", "workloads", "common", "tests",
            "scripts", "benchmarks", "docs", "results", ".ci")
TOP_FILES = ("Makefile", "pyproject.toml")

_DIRS = "|".join(map(re.escape, TOP_DIRS))
_FILES = "|".join(map(re.escape, TOP_FILES))
_PATH = re.compile(rf"(?<![\w./~$:@-])((?:{_DIRS})/[^\s`'\"()\[\],;|]*|(?:{_FILES})(?![\w./-]))")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")  # a code span, not across a blank line
_LINK = re.compile(r"\]\(([^()\s]+)\)")
_PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_-]*")


def doc_pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _code_lines(text: str) -> tuple[str, list[tuple[int, str]]]:
    """The page with its code blocks blanked out (same line count), and the
    code blocks' lines as (line number, text)."""
    prose, code = [], []
    fenced, blank_before = False, True
    for n, line in enumerate(text.split("\n"), 1):
        if _FENCE.match(line):
            fenced = not fenced
            prose.append("")
        elif fenced or (line.startswith("    ") and (blank_before or code and code[-1][0] == n - 1)):
            code.append((n, line))
            prose.append("")
        else:
            prose.append(line)
        blank_before = not line.strip()
    return "\n".join(prose), code


def _clean(token: str) -> str | None:
    """The path a token names, or None for a pattern or placeholder."""
    path = re.split(r"[#:]", token, maxsplit=1)[0].rstrip(".,;:!?")
    if any(c in path for c in "*{}<>") or "..." in path:
        return None
    if any(_PLACEHOLDER.fullmatch(part) for part in path.split("/")):
        return None
    return path


def named_paths(page: Path, root: Path = ROOT) -> list[tuple[int, str, Path]]:
    """(line, path as written, the file it names) for every repository path on a page."""
    text = page.read_text(encoding="utf-8")
    prose, code = _code_lines(text)
    found: list[tuple[int, str, Path]] = []

    def scan(chunk: str, line: int) -> None:
        for m in _PATH.finditer(chunk):
            path = _clean(m.group(1))
            if path:
                found.append((line + chunk.count("\n", 0, m.start()), path, root / path))

    for m in _SPAN.finditer(prose):
        scan(m.group(1), prose.count("\n", 0, m.start(1)) + 1)
    for n, line in code:
        scan(line, n)
    for m in _LINK.finditer(prose):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):  # a URL
            continue
        path = target.split("#", 1)[0]
        found.append((prose.count("\n", 0, m.start()) + 1, target,
                      page.parent / path if path else page))
    return sorted(found, key=lambda f: f[0])


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    prose, _ = _code_lines(page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*$", prose, re.M):
        slug = _slug(m.group(1))
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def _git_ignored(paths: list[str], root: Path) -> set[str]:
    """Which of these repository-relative paths git ignores (none without git)."""
    if not paths:
        return set()
    try:
        r = subprocess.run(["git", "-C", str(root), "check-ignore", "--stdin"],
                           input="\n".join(paths), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return set()
    return set(r.stdout.split("\n")) - {""}


def missing_paths(pages: list[Path], root: Path = ROOT) -> list[str]:
    """'page:line: path' for every path a page names that does not exist (or an
    anchor its target does not have)."""
    missing: list[tuple[str, int, str, str]] = []
    for page in pages:
        for line, written, target in named_paths(page, root):
            if not target.exists():
                missing.append((page.relative_to(root).as_posix(), line, written, "missing"))
            elif "#" in written and target.suffix == ".md":
                anchor = written.split("#", 1)[1]
                if anchor not in anchors(target):
                    missing.append((page.relative_to(root).as_posix(), line, written,
                                    "no such heading"))
    outputs = _git_ignored(sorted({w for _, _, w, why in missing
                                   if why == "missing" and w.startswith("results/")}), root)
    return [f"{page}:{line}: {written} ({why})" for page, line, written, why in missing
            if written.rstrip("/") not in {o.rstrip("/") for o in outputs}]


def test_top_level_entries_exist():
    for name in (*TOP_DIRS, *TOP_FILES):
        assert (ROOT / name).exists(), name


def test_every_path_the_docs_name_exists():
    missing = missing_paths(doc_pages())
    assert not missing, ("the docs name paths that do not exist (fix the page, or see this "
                         "module's docstring for what is skipped):\n  " + "\n  ".join(missing))


def test_a_missing_path_is_found(tmp_path):
    """The check itself: a page naming a file that is not there fails, with its
    line; patterns, placeholders, other directories' paths and run outputs do not."""
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "metrics.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Its section\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# A README\n"
        "Present: `harness/metrics.py:12`, `harness/metrics.py`'s `summarize`,\n"
        "[a page](docs/a.md#its-section), `python harness/metrics.py --x`, [up](#a-readme).\n"
        "Skipped: `harness/orgs/<name>.py`, `harness/*.py`, `tests/unit/PACKAGE/`,\n"
        "`/tmp/base/harness/gone.py`, `vllm-project/vllm:tests/v1/core/utils.py`.\n"
        "Missing: `harness/gone.py`, see\n"
        "[there](docs/a.md#no-section).\n"
        "\n"
        "    python scripts/gone.sh\n"
        "```\n"
        "docs/gone.md\n"
        "```\n")
    assert missing_paths([page], tmp_path) == [
        "README.md:6: harness/gone.py (missing)",
        "README.md:7: docs/a.md#no-section (no such heading)",
        "README.md:9: scripts/gone.sh (missing)",
        "README.md:11: docs/gone.md (missing)",
    ]
