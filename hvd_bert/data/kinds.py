"""The kinds of prepared data (the sidecar's ``kind``) and each kind's tf.train.Example layout:
``{feature: (dtype, length)}``, as Google's BERT scripts write them."""

from __future__ import annotations

from hvd_bert.data.records import DatasetError

__all__ = ["KIND_PRETRAIN", "KIND_CLASSIFY", "KIND_SQUAD", "KIND_TOKENS", "FINETUNE_KINDS",
           "pretraining_spec", "classification_spec", "squad_spec", "token_spec", "spec_for_meta"]

KIND_PRETRAIN = "bert-pretraining"
KIND_CLASSIFY = "bert-classification"
KIND_SQUAD = "bert-squad"
KIND_TOKENS = "bert-token-classification"
FINETUNE_KINDS = (KIND_CLASSIFY, KIND_SQUAD, KIND_TOKENS)  # what hvd-bert finetune trains on



def pretraining_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict:
    """Google BERT's pretraining features: name -> (kind, length)."""
    s, p = max_seq_length, max_predictions_per_seq
    return {"input_ids": ("int", s), "input_mask": ("int", s), "segment_ids": ("int", s),
            "masked_lm_positions": ("int", p), "masked_lm_ids": ("int", p),
            "masked_lm_weights": ("float", p), "next_sentence_labels": ("int", 1)}


def spec_for_meta(meta: dict) -> dict:
    """The feature spec (name -> (kind, length)) of a prepared folder, from its sidecar."""
    if meta["kind"] == KIND_PRETRAIN:
        return pretraining_spec(meta["max_seq_length"], meta["max_predictions_per_seq"])
    if meta["kind"] == KIND_CLASSIFY:
        return classification_spec(meta["max_seq_length"], bool(meta.get("regression")))
    if meta["kind"] == KIND_SQUAD:
        return squad_spec(meta["max_seq_length"], meta["is_training"])
    if meta["kind"] == KIND_TOKENS:
        return token_spec(meta["max_seq_length"])
    raise DatasetError(f"no reader for data of kind {meta['kind']!r}")


def classification_spec(max_seq_length: int, regression: bool = False) -> dict:
    """A classification record; a regression set (STS-B) has a float ``label_values`` instead
    of ``label_ids``."""
    s = max_seq_length
    return {"input_ids": ("int", s), "input_mask": ("int", s), "segment_ids": ("int", s),
            **({"label_values": ("float", 1)} if regression else {"label_ids": ("int", 1)})}


def squad_spec(max_seq_length: int, is_training: bool) -> dict:
    """A SQuAD feature (``hvd_bert.data.squad``): Google's names; training features add the
    answer span."""
    s = max_seq_length
    spec = {"unique_ids": ("int", 1), "input_ids": ("int", s), "input_mask": ("int", s),
            "segment_ids": ("int", s)}
    if is_training:
        spec.update(start_positions=("int", 1), end_positions=("int", 1), is_impossible=("int", 1))
    return spec


def token_spec(max_seq_length: int) -> dict:
    """A token classification record (``hvd_bert.data.token_classification``): a label a
    position, -1 where nothing is scored."""
    s = max_seq_length
    return {"input_ids": ("int", s), "input_mask": ("int", s), "segment_ids": ("int", s),
            "label_ids": ("int", s)}
