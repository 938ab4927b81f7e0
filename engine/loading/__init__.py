"""Loading: from what the user named (-m, -hf) to a built MLX model.

Owns resolving a model reference (local folder, .gguf file, Hugging Face cache), reading a checkpoint's files,
the family registry (which family file serves a checkpoint, as what kind of model), materializing weights
(dtype, quantization) and the heads stored beside a trunk (Dense, classifier). The two file formats live here
as two implementations of one seam: a safetensors folder and a GGUF file (`gguf/`: the reader, its quants, its
vocabulary, the per-architecture tensor-name maps). May import `engine.types`, `engine.errors`,
`engine.checkpoint`, `engine.families`, `engine.text` and `engine.compute`; never `runtime` or `multimodal`.
"""
