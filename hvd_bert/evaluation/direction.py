"""Whether a larger or a smaller value of a metric is better, for the best model and early
stopping (as Hugging Face Trainer's ``greater_is_better``): losses, perplexity and errors are
better smaller; accuracy, F1, exact match, correlations, HR and NDCG larger. A metric of the
user's own that this table does not know needs ``greater_is_better`` said."""

from __future__ import annotations

__all__ = ["greater_is_better", "better"]

SMALLER = ("loss", "perplexity", "ppl", "error", "mse", "rmse", "mae", "wer", "cer")
LARGER = ("accuracy", "acc", "f1", "exact", "exact_match", "em", "mcc", "pearson", "spearman", "hr", "ndcg",
          "auc", "precision", "recall", "bleu", "rouge", "best_f1", "best_exact", "hasans_f1", "hasans_exact")


def greater_is_better(metric: str, override: bool | None = None) -> bool:
    """Whether a larger ``metric`` (``eval_loss``, ``eval_accuracy``, ``hr@10``) is better:
    ``override`` if given, else by its name; a ValueError naming the setting for a name that
    says neither."""
    if override is not None:
        return bool(override)
    name = metric.lower().removeprefix("eval_").removeprefix("eval/")
    base = name.split("@")[0]
    if base in SMALLER or any(name.endswith("_" + s) or name.startswith(s + "_") for s in SMALLER):
        return False
    if base in LARGER or any(name.endswith("_" + s) or name.startswith(s + "_") for s in LARGER):
        return True
    raise ValueError(f"metric {metric!r} does not say whether larger or smaller is better: set "
                     f"greater_is_better=true or false")


def better(score: float, best: float | None, larger: bool) -> bool:
    """Whether ``score`` improves on ``best`` (None: nothing yet)."""
    return best is None or (score > best if larger else score < best)
