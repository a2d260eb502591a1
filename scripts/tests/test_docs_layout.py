"""The docs that describe the tree stay true to it: README's layout table and docs/design.md's
crate tree name every crate under crates/, the ADR index lists every record, and no document a
user reads points outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def crates() -> list[str]:
    return sorted(p.parent.name for p in (REPO / "crates").glob("*/Cargo.toml"))


def package_name(crate_dir: str) -> str:
    text = (REPO / "crates" / crate_dir / "Cargo.toml").read_text()
    m = re.search(r'^name\s*=\s*"([^"]+)"', text, re.M)
    assert m, crate_dir
    return m.group(1)


def test_readme_layout_names_every_crate():
    text = (REPO / "README.md").read_text()
    layout = text[text.index("## Layout") :]
    layout = layout[: layout.find("\n## ", 3)] if "\n## " in layout[3:] else layout
    tiers = {"cordon-runtime", "cordon-wasm", "cordon-container", "cordon-gvisor", "cordon-microvm"}
    missing = [
        c
        for c in crates()
        if f"crates/{c}" not in layout and not (c in tiers and f"-{c.split('-', 1)[1]}" in layout)
    ]
    assert not missing, f"README.md's layout does not name {missing}: add a row for each"


def test_design_crate_tree_names_every_crate():
    text = (REPO / "docs" / "design.md").read_text()
    tree = text[text.index("## Crates") : text.index("## Core")]
    missing = [c for c in crates() if c not in tree and package_name(c) not in tree]
    assert not missing, f"docs/design.md's crate tree does not name {missing}"


def test_adr_index_lists_every_record():
    adr = REPO / "docs" / "adr"
    index = (adr / "README.md").read_text()
    files = sorted(p.name for p in adr.glob("[0-9][0-9][0-9][0-9]-*.md"))
    missing = [f for f in files if f"({f})" not in index]
    assert not missing, f"docs/adr/README.md does not list {missing}"
    numbers = [int(f[:4]) for f in files]
    for n in range(1, max(numbers) + 1):
        if n not in numbers:
            assert f"| {n:04d} |" in index, f"ADR {n:04d} is missing and the index does not say why"


def test_no_document_links_outside_the_repository():
    docs = [REPO / "README.md", REPO / "DEVELOPERS.md", *(REPO / "docs").rglob("*.md")]
    bad = []
    for doc in docs:
        for i, line in enumerate(doc.read_text().splitlines(), 1):
            for target in re.findall(r"\]\(([^)#]+)", line) + re.findall(r"`(\.\./[^`]+)`", line):
                if target.startswith(("http://", "https://", "mailto:")):
                    continue
                resolved = (doc.parent / target).resolve()
                if not resolved.is_relative_to(REPO):
                    bad.append(f"{doc.relative_to(REPO)}:{i}: {target}")
    assert not bad, "links outside the repository:\n" + "\n".join(bad)
