"""Where the data folders that ship with the code are (the reranker templates, the example configs).

Installed, each is a data package (pyproject.toml's [tool.setuptools.package-dir] maps templates/ to
engine.templates and config/ to compat.config_examples); in a source checkout it is the top-level folder of the
repository. This is the one place that tells the two apart.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

_REPOSITORY = Path(__file__).resolve().parent.parent  # engine/ sits at the top of a source checkout


def data_folder(package: str, repo_folder: str) -> Path:
    """The folder of the installed data package `package` (e.g. "engine.templates"), else `repo_folder` of the
    source checkout (e.g. "templates")."""
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:  # its parent package is not importable either
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return _REPOSITORY / repo_folder
