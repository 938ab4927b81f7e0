"""XLM-RoBERTa encoder (XLMRobertaModel, XLMRobertaForMaskedLM, XLMRobertaForSequenceClassification).

The trunk is BERT's (engine/families/bert.py) with two differences: position ids count real tokens from
pad_token_id + 1 (padding keeps position pad_token_id), and token types are always 0 (XLM-R tokenizers
emit none, so transformers' reference never receives any). The classifier head sits on the first token.
"""
from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from engine.families import bert


@dataclass
class ModelArgs(bert.ModelArgs):
    max_position_embeddings: int = 514
    type_vocab_size: int = 1
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 1


class Model(bert.Model):
    """The trunk: token ids -> final hidden states [B, L, D]."""

    def __init__(self, args: ModelArgs):
        super().__init__(args, add_pooler=False)

    @property
    def n_positions(self) -> int:
        # Positions start at pad_token_id + 1: the table holds pad_token_id + 1 fewer real tokens.
        return self.args.max_position_embeddings - self.args.pad_token_id - 1

    def position_ids(self, input_ids: mx.array, attention_mask: mx.array) -> mx.array:
        return positions_after_pad(input_ids, attention_mask, self.args.pad_token_id)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return super().__call__(input_ids, attention_mask, None)

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Trunk keys only: the `roberta.` prefix dropped, then BERT's rules (lm_head.*, pooler.* dropped)."""
        return bert.Model.sanitize({k.removeprefix("roberta."): v for k, v in weights.items()})


class ClassificationHead(nn.Module):
    """XLMRobertaClassificationHead: dense + tanh on the first token, then out_proj."""

    def __init__(self, args: ModelArgs, num_labels: int):
        super().__init__()
        self.dense = nn.Linear(args.hidden_size, args.hidden_size)
        self.out_proj = nn.Linear(args.hidden_size, num_labels)

    def __call__(self, hidden: mx.array) -> mx.array:
        return self.out_proj(mx.tanh(self.dense(hidden[:, 0])))


class SequenceClassifier(nn.Module):
    """XLMRobertaForSequenceClassification: trunk, classification head -> [B, labels]."""

    def __init__(self, args: ModelArgs, num_labels: int):
        super().__init__()
        self.roberta = Model(args)
        self.classifier = ClassificationHead(args, num_labels)

    @property
    def trunk(self) -> Model:
        return self.roberta

    def __call__(self, input_ids: mx.array, attention_mask: mx.array,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self.classifier(self.roberta(input_ids, attention_mask, token_type_ids))

    @staticmethod
    def label_count(weights: dict[str, mx.array]) -> int:
        return int(weights["classifier.out_proj.weight"].shape[0])

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        trunk = Model.sanitize({k: v for k, v in weights.items() if k.startswith("roberta.")})
        out = {"roberta." + k: v for k, v in trunk.items()}
        out.update({k: v for k, v in weights.items() if k.startswith(("classifier.dense.", "classifier.out_proj."))})
        return out


def positions_after_pad(input_ids: mx.array, attention_mask: mx.array, pad: int) -> mx.array:
    """transformers' create_position_ids_from_input_ids (RoBERTa, MPNet), also honouring the attention mask: real
    tokens count from pad + 1, padding keeps position pad."""
    real = (input_ids != pad).astype(mx.int32) * (attention_mask != 0).astype(mx.int32)
    return mx.cumsum(real, axis=1) * real + pad
