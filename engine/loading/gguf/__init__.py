"""GGUF files (llama.cpp's format) served through our MLX families: the format (`format.py`, one side of the
checkpoint-format seam), reader, tokenizer from the metadata, one tensor-name map per family (arch/), llama.cpp's
rank head."""
