"""Vision-language families' input builders, one file per family (named as in engine/families): each file's
`input_builder(checkpoint, tokenizer)` makes the family's prompts and preprocesses its images (engine/multimodal/inputs.py)."""
