"""Loading: from what the user named (-m, -hf) to a built MLX model.

Owns resolving a model reference (`hub.py`: local folder, .gguf file, Hugging Face cache), the checkpoint-format
seam (`formats.py`: one interface, and the one place that picks the format) with its two implementations, a
safetensors folder (`safetensors.py`) and a GGUF file (`gguf/`: the format, reader, quants, vocabulary,
per-architecture tensor-name maps), the family registry (`registry.py`: which family serves a config.json, as
what kind of model, with which pooling), materializing weights (dtype, quantization) and the heads stored beside
a trunk (Dense, classifier). May import `engine.types`, `engine.errors`, `engine.checkpoint`, `engine.families`,
`engine.text`, `engine.multimodal` and `engine.compute`; never `runtime`.
"""
