"""`pip install .` (not editable) gives a server that finds its templates and example configs."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from compat.catalog import read_catalog
from compat.settings import parse_settings

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    # Built from the tracked files alone: a checkout's leftover build/ or *.egg-info can add modules that the
    # packages list leaves out, hiding what a fresh clone's `pip install .` would miss.
    source = tmp_path_factory.mktemp("source")
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], check=True, capture_output=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(out)],
                   check=True, capture_output=True)
    wheel = next(out.glob("mlx_embed_server-*.whl"))
    target = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(target)  # a wheel is installed by unpacking it into site-packages
    return target


def test_installed_package_finds_its_data(installed, tmp_path):
    probe = ("from engine.text.prompts import templates_dir; from compat.presets import config_examples_dir; "
             "import engine, compat; print(engine.__file__); print(templates_dir()); print(config_examples_dir())")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(installed)},
                         capture_output=True, text=True, check=True).stdout.split()
    package, templates, configs = (Path(line) for line in out)
    assert package.is_relative_to(installed)
    assert (templates / "qwen3_reranker.jinja").read_bytes() == (ROOT / "templates" / "qwen3_reranker.jinja").read_bytes()
    assert sorted(p.name for p in configs.glob("*.ini")) == sorted(p.name for p in (ROOT / "config").glob("*.ini"))



def test_wheel_holds_every_source_module(installed):
    """A subpackage missing from pyproject's list installs a server that fails when a family needs it."""
    sources = {p.relative_to(ROOT) for folder in ("compat", "engine") for p in (ROOT / folder).rglob("*.py")}
    assert sources, "no sources found"
    missing = sorted(str(p) for p in sources if not (installed / p).is_file())
    assert not missing, f"pyproject.toml [tool.setuptools] packages leaves out: {missing}"
    templates = {p.name for p in (ROOT / "templates").glob("*.jinja")}
    assert templates == {p.name for p in (installed / "engine" / "templates").glob("*.jinja")}

# The example models presets (config/models-*.ini) and the kinds of the models each declares, in order.
PRESET_KINDS = {
    "models-embed-rerank.ini": ["embedding", "rerank"],
    "models-two-embedders.ini": ["embedding", "embedding"],
    "models-rerank-only.ini": ["rerank", "rerank"],
}


@pytest.mark.parametrize("example", sorted((ROOT / "config").glob("*.ini")), ids=lambda p: p.name)
def test_example_configs_parse(example):
    if example.name.startswith("models-"):
        settings = parse_settings(["--models-preset", str(example)], {})
        catalog = read_catalog(settings)
        assert [spec.kind for spec in catalog.models] == PRESET_KINDS[example.name]
        assert len({name for spec in catalog.models for name in spec.names}) == sum(
            len(spec.names) for spec in catalog.models)
    else:  # a config.ini for the single-model server
        settings = parse_settings(["--config", str(example)], {})
        assert settings.embedding and read_catalog(settings) is None
