"""mlx-embed-server's engine: checkpoints, tokens, MLX families, pooling, the engine thread. No HTTP here.

The optimized BLAS must be bound before MLX is first imported, so it happens on package import.
"""
from engine import blas

blas.bind()

from engine import errors  # noqa: E402
from engine.checkpoint import default_model  # noqa: E402
from engine.normalize import normalize_embedding  # noqa: E402
from engine.prompts import text_formatter  # noqa: E402
from engine.residency import Lease, Residency  # noqa: E402
from engine.service import Engine  # noqa: E402
from engine.types import (  # noqa: E402
                          DEFAULT_MODEL_NAME,
                          EmbedResult,
                          EngineOptions,
                          ImageInput,
                          ModelInfo,
                          ModelState,
                          Pooling,
                          RerankResult,
                          ResidencyStatus,
                          Timings,
                          VocabType,
)

__all__ = ["DEFAULT_MODEL_NAME", "EmbedResult", "Engine", "EngineOptions", "ImageInput", "Lease", "ModelInfo",
           "ModelState", "Pooling", "RerankResult", "Residency", "ResidencyStatus", "Timings", "VocabType", "default_model",
           "errors", "normalize_embedding", "text_formatter"]
