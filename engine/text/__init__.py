"""Text: tokens and prompts.

Owns the tokenizer with llama-server's prompt rules (special tokens, mixed token/text prompts, pieces,
truncation keeping the trailing specials, the longest-first cut of a pair), the SentencePiece rebuild for
checkpoints without tokenizer.json, sentence-transformers' named prompts, instruction templates, rerank prompts
chat-template inputs, and pylate ColBERT's query / document formats. No MLX. May import `engine.types`,
`engine.errors` and `engine.checkpoint` only.
"""
