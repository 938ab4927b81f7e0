"""Multimodal: images into model inputs.

Owns image decoding (with its pixel bounds), the image processors (SigLIP's fixed size, Qwen's dynamic
resolution, tiling), the vision-language input contract (`inputs.py`: what a builder returns; `pairs.py`: the
same for rerankers whose prompts hold images) and each family's input builder (`builders/<family>.py`, named
after its family file). Runs on request threads, never touches MLX. May import `engine.types`,
`engine.errors`, `engine.checkpoint`, `engine.families` (a family's constants and ModelArgs) and `engine.text`.
"""
