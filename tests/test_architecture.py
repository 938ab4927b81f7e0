"""Import direction, checked on the AST of every source file (house rules)."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE_FORBIDDEN = ("compat", "falcon", "waitress", "pydantic", "pydantic_settings", "orjson")
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


# engine/'s groups, bottom to top: a module may import its own group and the groups listed for it (and `types`,
# `errors`, which everyone may import). The facade (engine/__init__.py) may import anything.
ENGINE_LAYERS = {
    "engine.checkpoint": set(),
    "engine.families": set(),
    "engine.resources": set(),
    "engine.text": {"engine.checkpoint", "engine.resources"},
    "engine.multimodal": {"engine.checkpoint", "engine.families", "engine.text"},
    "engine.compute": {"engine.multimodal"},
    "engine.loading": {"engine.checkpoint", "engine.families", "engine.text", "engine.multimodal", "engine.compute"},
    "engine.runtime": {"engine.checkpoint", "engine.families", "engine.text", "engine.multimodal", "engine.compute",
                       "engine.loading", "engine.resources"},
    "engine.offline": {"engine.checkpoint", "engine.compute", "engine.runtime"},
}
EVERYONE = {"engine.types", "engine.errors"}
SOURCE_FOLDERS = ("engine", "compat", "benchmarks", "scripts")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _source_files() -> Iterator[Path]:
    for folder in SOURCE_FOLDERS:
        yield from (ROOT / folder).rglob("*.py")


def _module_graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports (lazy and TYPE_CHECKING imports included): `from p import
    name` is an import of the module p.name where one exists, else of p."""
    files = {_module_name(path): path for path in _source_files()}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                edges |= {f"{module}.{a.name}" if f"{module}.{a.name}" in files else module for a in node.names}
        graph[name] = {e for e in edges if e in files and e != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _group(module: str) -> str | None:
    for group in (*ENGINE_LAYERS, *EVERYONE):
        if module == group or module.startswith(group + "."):
            return group
    return None


def test_no_import_circles():
    assert _circles(_module_graph()) == []


def test_engine_groups_import_only_the_groups_below():
    wrong = []
    for module, imported in _module_graph().items():
        group = _group(module)
        if module == "engine" or group is None or group in EVERYONE:
            continue
        for target in imported:
            target_group = _group(target)
            if target_group is not None and target_group != group and target_group not in EVERYONE \
                    and target_group not in ENGINE_LAYERS[group]:
                wrong.append(f"{module} imports {target}")
    assert wrong == []


def test_every_engine_module_belongs_to_a_group():
    loose = [m for m in _module_graph() if m.startswith("engine.") and _group(m) is None]
    assert loose == []
