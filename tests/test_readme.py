"""The documentation: docs/options.md documents every option exactly as compat/settings/ declares it, CI runs
the README's test command, every relative link in README.md and docs/ leads somewhere, and docs/architecture.md
names every package."""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from readme_options import commands_markdown, options_markdown  # noqa: E402

OPTIONS_PAGE = ROOT / "docs" / "options.md"
ARCHITECTURE_PAGE = ROOT / "docs" / "architecture.md"


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def _options_page() -> str:
    return OPTIONS_PAGE.read_text(encoding="utf-8")


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_options_table_matches_the_declaration():
    block = re.search(r"<!-- options:begin[^>]*-->\n(.*?)<!-- options:end -->", _options_page(), re.S)
    assert block, "docs/options.md has no options block"
    assert block.group(1) == options_markdown(), "regenerate it: .venv/bin/python scripts/readme_options.py --write"


def test_offline_commands_tables_match_the_declaration():
    block = re.search(r"<!-- commands:begin[^>]*-->\n(.*?)<!-- commands:end -->", _options_page(), re.S)
    assert block, "docs/options.md has no offline commands block"
    assert block.group(1) == commands_markdown(), "regenerate it: .venv/bin/python scripts/readme_options.py --write"


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```sh\n(.*?)\n```", _readme(), re.S)
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text()


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"(`+)(?:(?!\1).)+?\1", "", text)


def _links(text: str) -> list[str]:
    """Targets of inline links and images, `[text](target)` / `![alt](target "title")`."""
    return [m.group(1) for m in re.finditer(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", _prose(text))]


def _relative(target: str) -> bool:
    return not re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) and not target.startswith("#")


def test_every_relative_link_points_to_an_existing_file():
    broken = []
    for document in _documents():
        for target in _links(document.read_text(encoding="utf-8")):
            if not _relative(target):
                continue
            path = target.split("#", 1)[0].split("?", 1)[0]
            if not (document.parent / path).exists():
                broken.append(f"{document.relative_to(ROOT)}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def _anchors(text: str) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M),
                              re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_every_link_to_a_heading_finds_it():
    broken = []
    for document in _documents():
        for target in _links(document.read_text(encoding="utf-8")):
            if "#" not in target or not (_relative(target) or target.startswith("#")):
                continue
            path, anchor = target.split("#", 1)
            page = (document.parent / path) if path else document
            if page.suffix == ".md" and page.exists() and anchor not in _anchors(page.read_text(encoding="utf-8")):
                broken.append(f"{document.relative_to(ROOT)}: {target}")
    assert not broken, "links to headings that do not exist:\n" + "\n".join(broken)


def _packages() -> list[Path]:
    """Every folder of engine/ and compat/ (the two included) that holds an __init__.py."""
    return sorted(init.parent.relative_to(ROOT) for top in ("engine", "compat")
                  for init in (ROOT / top).rglob("__init__.py"))


def _names(package: Path, text: str) -> bool:
    """`engine/loading/` (or `engine/loading` ending a path) or the dotted `engine.loading` appears in the text."""
    path, dotted = "/".join(package.parts), ".".join(package.parts)
    return bool(re.search(rf"(?<![\w./-]){re.escape(path)}(?:/|(?![\w.-]))", text)
                or re.search(rf"(?<![\w./-]){re.escape(dotted)}(?!\w)", text))


def test_architecture_page_names_every_package():
    assert ARCHITECTURE_PAGE.exists(), "docs/architecture.md is missing: it must describe every package"
    text = ARCHITECTURE_PAGE.read_text(encoding="utf-8")
    missing = [f"{'/'.join(p.parts)}/" for p in _packages() if not _names(p, text)]
    assert not missing, "docs/architecture.md does not name: " + ", ".join(missing)
