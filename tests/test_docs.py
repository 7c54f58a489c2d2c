"""The README and docs/: every relative link leads to a file that exists and, with a #fragment,
to a heading in it; the README's two set-up commands are the ones CI runs."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, -1 -2 on repeats."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return [u for u in LINK.findall(text) if not re.match(r"[a-z]+:", u)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for url in links(page):
        path, _, fragment = url.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{url}: no file {target.relative_to(ROOT)}")
        elif fragment and target.suffix == ".md" and fragment not in anchors(target):
            broken.append(f"{url}: no heading #{fragment} in {target.relative_to(ROOT)}")
    assert broken == []


def test_the_anchor_rules():
    page = ROOT / "docs" / "benchmarks.md"
    assert "gate-bench_gatepy" in anchors(page)
    assert "envforge-sandbox-build" in anchors(ROOT / "docs" / "cli.md")


def test_readme_set_up_commands_are_the_ones_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert ("python3 -m venv .venv && .venv/bin/pip install -c constraints.txt -e . && "
            ".venv/bin/envforge audit generated_envs/*") in readme
    assert ".venv/bin/pip install -c constraints.txt -e '.[dev,train]' && .venv/bin/python -m pytest -q" in readme
    assert ".venv/bin/pip install -q -c constraints.txt -e '.[dev,train]'" in ci
    assert re.search(r"^\.venv/bin/python -m pytest -q\b", ci, flags=re.M)
