"""RoBERTa encoder (RobertaModel, RobertaForMaskedLM, RobertaForSequenceClassification: all-distilroberta-v1,
all-roberta-large-v1, the stsb / quora RoBERTa cross-encoders).

transformers' XLM-RoBERTa is RoBERTa's code under another name: the same weight keys (`roberta.` prefix, lm_head.*
dropped), positions after the pad id, token types always 0, the classification head (dense + tanh on <s>, then
out_proj). engine/families/xlm_roberta.py serves it as it is; this file gives it RoBERTa's registry entries.
"""
from __future__ import annotations

from engine.families.xlm_roberta import Model, ModelArgs, SequenceClassifier

__all__ = ["Model", "ModelArgs", "SequenceClassifier"]
