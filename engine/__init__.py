"""mlx-embed-server's engine: checkpoints, tokens, MLX families, pooling, the engine thread. No HTTP here.

The optimized BLAS must be bound before MLX is first imported, so it happens on package import, with the
allocator settings (engine/runtime/malloc.py).
"""
from engine.runtime import blas, malloc

blas.bind()
malloc.keep_freed_memory()

from engine import errors  # noqa: E402
from engine.compute.normalize import check_dimensions, normalize_embedding  # noqa: E402
from engine.compute.maxsim import maxsim  # noqa: E402
from engine.compute.quantize import QUANTIZED_TYPES, dequantize, quantize  # noqa: E402
from engine.loading.hub import default_model  # noqa: E402
from engine.offline import Classifier, Encoder, Reranker, token_vectors_reason  # noqa: E402
from engine.resources import data_folder  # noqa: E402
from engine.runtime.residency import Lease, Residency  # noqa: E402
from engine.runtime.engine import Engine  # noqa: E402
from engine.types import (  # noqa: E402
                          DEFAULT_MODEL_NAME,
                          ClassifyResult,
                          EmbedResult,
                          EngineOptions,
                          ImageInput,
                          ModelInfo,
                          ModelState,
                          Pooling,
                          RerankResult,
                          ResidencyStatus,
                          SparseResult,
                          SparseVector,
                          Timings,
                          VocabType,
)

__all__ = ["DEFAULT_MODEL_NAME", "QUANTIZED_TYPES", "Classifier", "ClassifyResult", "EmbedResult", "Encoder", "Engine",
           "EngineOptions", "ImageInput", "Lease", "ModelInfo", "ModelState", "Pooling", "RerankResult", "Reranker",
           "Residency", "ResidencyStatus", "SparseResult", "SparseVector", "Timings",
           "VocabType", "check_dimensions", "data_folder", "default_model", "dequantize", "errors", "maxsim",
           "normalize_embedding", "quantize", "token_vectors_reason"]
