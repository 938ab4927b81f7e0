"""Import direction, checked on the AST of every source file (house rules)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE_FORBIDDEN = ("compat", "falcon", "waitress", "pydantic_settings", "orjson")
COMPAT_ALLOWED_ENGINE = {"engine", "engine.types", "engine.errors"}


def _package(path: Path) -> list[str]:
    return list(path.relative_to(ROOT).with_suffix("").parts[:-1])


def _imports(path: Path) -> list[str]:
    """Absolute module names imported, relative imports resolved against the file's package."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _package(path)[: len(_package(path)) - node.level + 1] if node.level else []
            names.append(".".join([*base, *([node.module] if node.module else [])]))
    return names


def _reads(path: Path, attr: str, owner: str) -> bool:
    """`owner.attr`, `from owner import attr`, or (for os.environ) os.getenv."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == owner and (
                node.attr == attr or (attr == "environ" and node.attr == "getenv")):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == owner and any(
                a.name in (attr, "getenv") for a in node.names):
            return True
    return False


def test_engine_never_imports_transport():
    for path in (ROOT / "engine").rglob("*.py"):
        for name in _imports(path):
            assert name.split(".")[0] not in ENGINE_FORBIDDEN, f"{path.relative_to(ROOT)} imports {name}"


def test_engine_reads_no_environment_or_argv():
    for path in (ROOT / "engine").rglob("*.py"):
        assert not _reads(path, "environ", "os") and not _reads(path, "argv", "sys"), path


def test_compat_uses_only_the_engine_facade():
    for path in (ROOT / "compat").rglob("*.py"):
        for name in _imports(path):
            if name.split(".")[0] == "engine":
                assert name in COMPAT_ALLOWED_ENGINE, f"{path.relative_to(ROOT)} imports {name}"


# The layered resolver, and the command-line entry point that hands it sys.argv and os.environ.
ARGV_AND_ENVIRONMENT_READERS = {Path("compat/settings/resolver.py"), Path("compat/cli.py")}


def test_only_the_resolver_and_cli_read_argv_and_environment():
    for path in (ROOT / "compat").rglob("*.py"):
        if path.relative_to(ROOT) in ARGV_AND_ENVIRONMENT_READERS:
            continue
        assert not _reads(path, "environ", "os") and not _reads(path, "argv", "sys"), path


def test_families_import_only_mlx_and_their_siblings():
    for path in (ROOT / "engine" / "families").glob("*.py"):
        for name in _imports(path):
            top = name.split(".")[0]
            assert top in {"mlx", "__future__", "dataclasses", "typing", "math", "inspect", "numpy"} \
                or name.startswith(("engine.families", "engine.errors")), f"{path.name} imports {name}"
