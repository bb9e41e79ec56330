"""The jobs' configurations, each a :class:`~hvd_bert.config.train.TrainConfig` with the job's
defaults plus its model and data: BERT pretraining, BERT fine-tuning, NCF. Recipes
(``recipes/*.yaml``) and ``--set`` change them key by key."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Literal

from hvd_bert.config.base import ConfigError, doc, require
from hvd_bert.config.train import BatchConfig, OptimConfig, ScheduleConfig, TrainConfig

__all__ = ["PretrainConfig", "FinetuneConfig", "NCFConfig", "ModelConfig", "PredictConfig"]


def refuse_pytorch_only_train(train, framework: str) -> None:
    """The ``train`` settings only the PyTorch engine has, refused in one line under TensorFlow."""
    require(not (train.host_reads == "log" and framework == "tf"),
            "train.host_reads=log is PyTorch's (the Keras engine reads each step's outcome as it "
            "applies it): use framework=pt or train.host_reads=step")
    require(not (train.precision.weights == "bf16" and framework == "tf"),
            "train.precision.weights=bf16 is PyTorch's (Keras keeps its variables in fp32 under the "
            "mixed_bfloat16 policy): use framework=pt or train.precision.weights=fp32")


@dataclass(frozen=True)
class PretrainConfig:
    """BERT pretraining: the engine settings plus model and data. Defaults: a tiny BERT on the
    built-in corpus with NVLAMB and BERT's polynomial warmup (NVIDIA's recipe shape)."""

    JOB: ClassVar[str] = "pretrain"  # the job a recipe names (job: pretrain) when it is for this one

    train: TrainConfig = doc(TrainConfig(
        optim=OptimConfig(name="nvlamb", lr=5e-3, weight_decay=0.01),
        schedule=ScheduleConfig(name="poly_warmup", warmup=0.1, total_steps=100, power=0.5),
        batch=BatchConfig(local_batch_size=32, backward_passes_per_step=2),
        checkpoint_every=50, output_dir=""), "")
    model: Literal["tiny", "mini", "small", "base", "large"] = doc("tiny", "BERT size preset")
    data: str = doc("", "prepared pretraining folder (hvd-bert prepare-bert); empty: the built-in "
                        "corpus prepared under the cache folder")
    max_seq_length: int = doc(128, "sequence length the data was prepared with (phase 1: 128, 2: 512)")
    max_predictions_per_seq: int = doc(20, "masked positions per sequence in the data")
    shuffle_buffer: int = doc(1024, "records per shuffle window of the reader")
    record_striding: bool = doc(False, "every rank reads every shard and keeps every world_size-th "
                                       "record (automatic when there are fewer shards than ranks)")
    dropout: float = doc(0.1, "BERT's hidden and attention dropout (a probability in [0, 1))")
    pack_sequences: bool = doc(False, "pack each batch's sequences into fewer rows (each attends only to "
                                      "itself, its positions restart): the same loss, fewer padded "
                                      "tokens computed; PyTorch only")
    packed_attention: Literal["bias", "varlen"] = doc(
        "bias", "how packed rows keep their sequences apart: bias (a dense [rows, 1, S, S] mask, "
                "SDPA's math kernel) or varlen (SDPA on nested jagged tensors, each sequence to "
                "itself: no S x S mask, the flash and memory-efficient kernels on a GPU)")
    compile_layers: bool = doc(False, "torch.compile each encoder layer (on a GPU: its bias, dropout, "
                                      "residual and LayerNorm kernels fused); the first steps compile; "
                                      "PyTorch only")
    init_checkpoint: str = doc("", "phase 2: start from this phase-1 checkpoint's weights with a "
                                   "fresh optimizer and schedule")
    eval_data: str = doc("", "held-out prepared pretraining folder (same vocab and lengths), scored at "
                             "the end and every eval_every steps: masked-LM loss and accuracy, NSP "
                             "accuracy; empty: none")
    eval_every: int = doc(0, "also evaluate eval_data every this many steps (0: at the end only)")
    eval_batch_size: int = doc(64, "sequences per evaluation batch on one rank")
    progress: bool = doc(True, "show a progress bar on rank 0")
    framework: Literal["pt", "tf"] = doc("pt", "pt (PyTorch) or tf (TensorFlow); also --framework")

    def __post_init__(self) -> None:
        refuse_pytorch_only_train(self.train, self.framework)
        require(not (self.train.activation_checkpointing != "off" and self.framework == "tf"),
                f"train.activation_checkpointing={self.train.activation_checkpointing} is PyTorch's (the "
                f"Keras BERT keeps its activations): use framework=pt or train.activation_checkpointing=off")
        require(0 <= self.dropout < 1, f"dropout is a probability in [0, 1), got {self.dropout}")
        require(0 <= self.shuffle_buffer <= 1 << 24, f"shuffle_buffer must be in [0, 16777216] records "
                                                     f"(0 or 1: no shuffling), got {self.shuffle_buffer}")
        require(self.eval_every >= 0 and self.eval_batch_size > 0,
                 "eval_every must be >= 0 and eval_batch_size > 0")
        require(self.max_seq_length > 0 and self.max_predictions_per_seq > 0,
                 "max_seq_length and max_predictions_per_seq must be > 0")
        require(not (self.pack_sequences and self.framework == "tf"),
                "pack_sequences is PyTorch's only (the Keras BERT has no packed layout): use framework=pt "
                "or pack_sequences=false")
        require(self.packed_attention == "bias" or self.pack_sequences,
                "packed_attention=varlen is how packed rows attend: set pack_sequences=true too, or "
                "leave packed_attention=bias")
        require(not (self.compile_layers and self.framework == "tf"),
                "compile_layers is PyTorch's (torch.compile): use framework=pt or compile_layers=false")

    def resolve_given(self, given: set[str]) -> PretrainConfig:
        """A global batch the user gave derives what the user did not (TrainConfig's rule)."""
        return replace(self, train=self.train.resolve_given(given, "train."))


@dataclass(frozen=True)
class FinetuneConfig:
    """BERT fine-tuning from a pretrained checkpoint (Google's run_classifier / run_squad
    recipe: AdamW, linear warmup and decay, a few epochs): sentence(-pair) classification,
    regression (STS-B) or SQuAD, as the prepared data says."""

    JOB: ClassVar[str] = "finetune"  # the job a recipe names (job: finetune) when it is for this one

    train: TrainConfig = doc(TrainConfig(
        optim=OptimConfig(name="adamw", lr=5e-5, weight_decay=0.01),
        schedule=ScheduleConfig(name="poly_warmup", warmup=0.1, total_steps=1000, power=1.0),
        batch=BatchConfig(local_batch_size=32, backward_passes_per_step=1),
        log_every=10, checkpoint_every=0, output_dir=""), "")
    data: str = doc("", "training set prepared by hvd-bert prepare-classification, prepare-squad or "
                        "prepare-token-classification (required)")
    eval_data: str = doc("", "evaluation set (prepared with the training set's --labels; for SQuAD a dev "
                             "file prepared with --split dev); empty: none")
    task: str = doc("", "what the data must be: squad, classification, regression, token-classification or "
                        "a GLUE task name; "
                        "empty: whatever the prepared data is (also --task)")
    init_checkpoint: str = doc("", "pretrained weights: a run folder, ckpt-*.pt / ckpt-*.tf, or a .npz "
                                   "(hvd-bert convert); empty: train from BERT's initialisation")
    model: Literal["tiny", "mini", "small", "base", "large"] = doc(
        "tiny", "BERT size preset when init_checkpoint does not say (a .npz or a run folder does)")
    epochs: float = doc(3.0, "passes over the training set; sets train.schedule.total_steps "
                             "(0: use train.schedule.total_steps)")
    do_train: bool = doc(True, "false: only evaluate eval_data (SQuAD: write predictions) with "
                               "init_checkpoint, e.g. a fine-tuned run folder")
    eval_every: int = doc(0, "also evaluate every this many steps (0: at the end only)")
    best_metric: str = doc("", "the evaluation score that decides the best model and early stopping, "
                               "as metrics.jsonl names it (eval_accuracy, eval_f1, eval_mcc, "
                               "eval_pearson, ...); empty: the task's own (GLUE's metric, SQuAD's F1, "
                               "STS-B's Pearson, else accuracy)")
    greater_is_better: bool | None = doc(None, "whether a larger best_metric is better; null: from its "
                                                  "name (losses and perplexity smaller; accuracy, F1, "
                                                  "exact match, correlations larger)")
    keep_best: bool = doc(True, "write the best evaluated model's weights to best.npz in the run folder "
                                "(best.json says its step and score); hvd-bert convert exports it")
    early_stopping_patience: int = doc(0, "stop when best_metric has not improved for this many "
                                          "evaluations in a row (eval_every); 0: never")
    eval_batch_size: int = doc(64, "examples per evaluation batch on one rank")
    dropout: float = doc(0.1, "BERT's hidden and attention dropout")
    length_grouping: int = doc(32, "pad each batch to its longest sequence, after sorting every this many "
                                   "batches of a rank by length (1: no sorting; 0: pad to max_seq_length)")
    n_best_size: int = doc(20, "SQuAD: candidate answers kept per question (nbest_predictions.json)")
    max_answer_length: int = doc(30, "SQuAD: the longest answer in WordPiece tokens")
    null_score_diff_threshold: float = doc(0.0, "SQuAD v2.0: predict no answer above this null-score margin")
    shuffle_buffer: int = doc(1024, "records per shuffle window of the reader")
    progress: bool = doc(True, "show a progress bar on rank 0")
    framework: Literal["pt", "tf"] = doc("pt", "pt (PyTorch) or tf (TensorFlow); also --framework")

    def __post_init__(self) -> None:
        refuse_pytorch_only_train(self.train, self.framework)
        require(not (self.train.activation_checkpointing != "off" and self.framework == "tf"),
                f"train.activation_checkpointing={self.train.activation_checkpointing} is PyTorch's (the "
                f"Keras BERT keeps its activations): use framework=pt or train.activation_checkpointing=off")
        require(0 <= self.epochs <= 1e6, f"epochs must be in [0, 1e6], got {self.epochs}")
        require(0 <= self.dropout < 1, f"dropout is a probability in [0, 1), got {self.dropout}")
        require(0 <= self.shuffle_buffer <= 1 << 24, f"shuffle_buffer must be in [0, 16777216] records "
                                                     f"(0 or 1: no shuffling), got {self.shuffle_buffer}")
        require(self.eval_batch_size > 0 and self.eval_every >= 0,
                f"eval_batch_size must be > 0 and eval_every >= 0, got {self.eval_batch_size}, "
                f"{self.eval_every}")
        require(self.length_grouping >= 0, f"length_grouping must be >= 0, got {self.length_grouping}")
        require(self.early_stopping_patience >= 0,
                f"early_stopping_patience must be >= 0, got {self.early_stopping_patience}")
        require(not self.early_stopping_patience or self.eval_every,
                "early_stopping_patience needs evaluations during training: set eval_every (steps)")
        require(self.n_best_size > 0 and self.max_answer_length > 0,
                 "n_best_size and max_answer_length must be > 0")

    def resolve_given(self, given: set[str]) -> FinetuneConfig:
        """The run's length from what the user gave: ``train.schedule.total_steps`` alone wins over
        the default ``epochs``; both given is a conflict. (A given global batch: TrainConfig's.)"""
        self = replace(self, train=self.train.resolve_given(given, "train."))
        if "train.schedule.total_steps" not in given:
            return self
        if "epochs" in given and self.epochs:
            raise ConfigError(f"epochs={self.epochs:g} and train.schedule.total_steps="
                              f"{self.train.schedule.total_steps} both set the run's length: give one "
                              f"(or epochs=0 to train train.schedule.total_steps steps)")
        return replace(self, epochs=0.0)


@dataclass(frozen=True)
class ModelConfig:
    """NeuMF sizes (NVIDIA's defaults): GMF factors and the MLP's layer widths (the first is
    the concatenated user and item MLP embeddings)."""

    factors: int = doc(64, "GMF embedding size")
    layers: tuple[int, ...] = doc((256, 256, 128, 64), "MLP widths; layers[0] / 2 is each MLP embedding")
    dropout: float = doc(0.0, "dropout between MLP layers (a probability in [0, 1))")

    def __post_init__(self) -> None:
        require(self.factors > 0, f"model.factors must be > 0, got {self.factors}")
        require(0 <= self.dropout < 1, f"model.dropout is a probability in [0, 1), got {self.dropout}")
        require(len(self.layers) >= 1 and all(w > 0 for w in self.layers),
                 f"model.layers must be positive widths, got {self.layers}")
        require(self.layers[0] % 2 == 0, f"model.layers[0] must be even (user + item), got {self.layers[0]}")


@dataclass(frozen=True)
class NCFConfig:
    """NCF (NeuMF) on implicit feedback with Horovod. Defaults: NVIDIA's model and Adam
    settings, sized for the synthetic ml-1m data on a small machine."""

    JOB: ClassVar[str] = "ncf"  # the job a recipe names (job: ncf) when it is for this one

    train: TrainConfig = doc(TrainConfig(
        optim=OptimConfig(name="adamw", lr=0.0045, beta1=0.25, beta2=0.5, eps=1e-8, weight_decay=0.0),
        schedule=ScheduleConfig(name="constant", total_steps=1),
        batch=BatchConfig(local_batch_size=8192, backward_passes_per_step=1),
        log_every=20, checkpoint_every=0, output_dir=""), "")
    model: ModelConfig = doc(ModelConfig(), "")
    data: str = doc("", "folder from hvd-bert prepare-ncf; empty: synthetic ml-1m prepared under the cache")
    epochs: int = doc(20, "maximum epochs (sets train.schedule.total_steps)")
    num_negatives: int = doc(4, "sampled negatives per positive in each epoch")
    target_hr: float = doc(0.0, "stop when HR@K reaches this (0: run all epochs)")
    top_k: int = doc(10, "K of HR@K and NDCG@K")
    eval_every: float = doc(1.0, "evaluate every this many epochs (fractions: within an epoch)")
    eval_batch_users: int = doc(1024, "users scored per evaluation batch on one rank")
    progress: bool = doc(False, "show a progress bar on rank 0")
    framework: Literal["pt", "tf"] = doc("pt", "pt (PyTorch) or tf (TensorFlow); also --framework")
    do_train: bool = doc(True, "false: evaluate init_checkpoint (HR@K, NDCG@K on the data's held-out "
                               "items) and write recommend's recommendations; nothing is trained")
    init_checkpoint: str = doc("", "with do_train=false: an NCF run folder (its best model, else its newest "
                                   "checkpoint) or one of its checkpoints")
    recommend: str = doc("", "with do_train=false: a file of user ids (the ratings file's, one a line): "
                             "each user's top_k items it has not rated, to <file>.recommendations.jsonl")

    def __post_init__(self) -> None:
        refuse_pytorch_only_train(self.train, self.framework)
        require(self.epochs > 0, f"epochs must be > 0, got {self.epochs}")
        require(self.num_negatives > 0, f"num_negatives must be > 0, got {self.num_negatives}")
        require(0 <= self.target_hr <= 1, f"target_hr must be in [0, 1], got {self.target_hr}")
        require(self.top_k > 0 and self.eval_every > 0 and self.eval_batch_users > 0,
                 "top_k, eval_every and eval_batch_users must be > 0")

    def resolve_given(self, given: set[str]) -> NCFConfig:
        """An NCF run's length is ``epochs`` (it sets ``train.schedule.total_steps``). (A given
        global batch: TrainConfig's.)"""
        self = replace(self, train=self.train.resolve_given(given, "train."))
        if "train.schedule.total_steps" in given:
            raise ConfigError(f"train.schedule.total_steps: an NCF run's length is set by epochs (now "
                              f"{self.epochs}), which sets it; give --set epochs=N instead")
        return self


@dataclass(frozen=True)
class PredictConfig:
    """Predictions of a fine-tuned classifier, regressor or SQuAD model on your own text: every
    example once across the ranks, written by rank 0 with the label names and scores (SQuAD:
    the answers)."""

    JOB: ClassVar[str] = "predict"  # the job a recipe names (job: predict) when it is for this one

    checkpoint: str = doc("", "a fine-tuning run folder (its best model, else its newest checkpoint; its "
                              "labels and vocab), its best.npz or a ckpt-* in it, or a Hugging Face folder "
                              "of a BertForSequenceClassification or BertForQuestionAnswering")
    pick: Literal["best", "latest"] = doc("best", "of a run folder: its best evaluated model (best.npz) "
                                                  "when it has one, or its latest checkpoint (--checkpoint "
                                                  "latest)")
    input: str = doc("", "a TSV/CSV with a header, a JSON-lines file, or a folder from hvd-bert "
                         "prepare-classification; SQuAD: a SQuAD file, JSON lines of question and "
                         "context, or a folder from prepare-squad --split dev")
    output: str = doc("", "where the predictions go: .jsonl (one object per example) or .tsv; SQuAD "
                          "also .json (the official predictions file); empty: <input>.predictions.jsonl "
                          "(SQuAD: .json)")
    text_a: str = doc("", "the column (TSV/CSV) or field (JSONL) of the text; empty: sentence, text or "
                          "the first column")
    text_b: str = doc("", "the column or field of a pair's second text; empty: none")
    id: str = doc("", "a column or field to copy into each prediction as its id; empty: the row number")
    label: str = doc("", "a column or field of gold labels, scored against the predictions (accuracy, F1, "
                         "MCC; regression: Pearson, Spearman); empty: label, when the input has one")
    max_seq_length: int = doc(0, "tokens per example; 0: the checkpoint's training length (else 128)")
    batch_size: int = doc(64, "examples per batch on one rank")
    precision: Literal["fp32", "bf16", "fp16"] = doc("fp32", "autocast for the forward pass")
    n_best_size: int = doc(20, "SQuAD: candidate answers considered per question")
    max_answer_length: int = doc(30, "SQuAD: the longest answer in WordPiece tokens")
    null_score_diff_threshold: float = doc(0.0, "SQuAD v2.0: predict no answer above this null-score margin")
    train: TrainConfig = doc(TrainConfig(), "(only train.horovod applies)")
    framework: Literal["pt", "tf"] = doc("pt", "pt (PyTorch) or tf (TensorFlow); also --framework")

    def __post_init__(self) -> None:
        require(self.batch_size > 0, f"batch_size must be > 0, got {self.batch_size}")
        require(self.max_seq_length >= 0, f"max_seq_length must be >= 0, got {self.max_seq_length}")
        require(self.n_best_size > 0 and self.max_answer_length > 0,
                "n_best_size and max_answer_length must be > 0")

