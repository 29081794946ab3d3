"""The README's API section, followed literally: its first code block is a training loop on raw
features and must run as written (a new user's first contact with the API). And the README as a
front page: short, with every relative link of it and of docs/*.md reaching a file and heading."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def api_training_block() -> str:
    """The first ```python block under the README's '## API' heading."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("\n## API\n"):]
    match = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert match, "the README's API section has no python block"
    return match.group(1)


def test_readme_api_loop_trains_on_raw_features():
    code = api_training_block()
    assert "normalize=True" in code and "torch.randn" in code  # raw features, as a CLIP tower gives them
    namespace: dict = {}
    torch.manual_seed(0)
    exec(compile(code, str(README), "exec"), namespace)
    loss = namespace["loss"]
    assert torch.isfinite(loss)
    for tower in (namespace["image_tower"], namespace["text_tower"]):
        assert all(torch.isfinite(p.grad).all() for p in tower.parameters())


# Links: the README is a front page whose sections point into docs/*.md; every relative link of
# the README and of the docs pages must reach a file, and a `#anchor` into a markdown file one of
# its headings, so that moving text between pages cannot leave a dead link behind.

ROOT = README.parent
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 300

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", flags=re.S | re.M)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", flags=re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: its text (links by their text) lowercased, punctuation
    dropped (letters, digits, '_', '-' and spaces stay), each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    """Every heading anchor of a markdown file, with GitHub's -1, -2, ... for repeated headings."""
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for match in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", text, flags=re.M):
        slug = github_anchor(match.group(1))
        out.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return out


def relative_links(path: pathlib.Path) -> list[str]:
    """The targets of the inline links and images of a markdown file outside code, without the
    absolute ones (http:, mailto:, ...)."""
    text = _CODE_SPAN.sub("code", _FENCE.sub("", path.read_text(encoding="utf-8")))
    return [t for t in _LINK.findall(text) if not _SCHEME.match(t)]


def test_github_anchor_rule():
    assert github_anchor("Multi-GPU / torch.distributed") == "multi-gpu--torchdistributed"
    assert github_anchor("Building the `cuda` backend") == "building-the-cuda-backend"
    assert github_anchor("Measured (mean of seeds 0–2)") == "measured-mean-of-seeds-02"
    assert github_anchor("How each paper maps onto the API") == "how-each-paper-maps-onto-the-api"


def test_link_extraction_skips_code_and_urls(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n[a](x.md) `[b](in_code.md)` [c](https://example.org) ![d](img.png)\n"
                    "[`e`](f.md#title)\n```\n[g](fenced.md)\n## Not a heading\n```\n", encoding="utf-8")
    assert relative_links(page) == ["x.md", "img.png", "f.md#title"]
    assert anchors(page) == {"title"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)} has dead links:\n" + "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(README)}
    orphans = [p.relative_to(ROOT) for p in PAGES[1:] if p.resolve() not in linked]
    assert not orphans, f"docs pages the README does not link: {orphans}"


def test_readme_stays_a_front_page():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < MAX_README_LINES, (f"README.md has {lines} lines: move the long parts to a docs/ "
                                      "page and link it")
