"""CamemBERT encoder (CamembertModel, CamembertForMaskedLM, CamembertForSequenceClassification: the French
sentence-camembert embedders and rerankers).

transformers' CamemBERT is RoBERTa's code (its base_model_prefix is `roberta` too) over a SentencePiece vocabulary:
engine/families/xlm_roberta.py serves it as it is; this file gives it CamemBERT's registry entries.
"""
from __future__ import annotations

from engine.families.xlm_roberta import Model, ModelArgs, SequenceClassifier

__all__ = ["Model", "ModelArgs", "SequenceClassifier"]
