"""BERT for pretraining in PyTorch (``BertForPreTraining``'s parameter names and initialisation),
free of parallelism: the engine applies Horovod from outside.

Speed-ups: the intermediate layer's bias + GELU is one fused kernel
(``hvd_bert.pt.kernels.gelu``); dropout, with the residual add after it, is one C loop whose
mask comes from a hash (``hvd_bert.pt.kernels.dropout``; PyTorch's draws an element at a time);
the query, key and value projections are one matrix product (:func:`qkv_heads`); attention uses
``scaled_dot_product_attention`` (written out where its probabilities take that dropout; a
packed batch with ``segment_offsets`` runs it each sequence to itself, on nested jagged tensors
or span by span (:func:`varlen_attention`), instead of through a dense ``[R, 1, S, S]`` bias);
and the masked-LM head (transform + vocabulary projection) runs only at the masked positions
(about 15% of tokens) instead of over every token, and on a CPU hands its weight's gradient to
the word-embedding lookup that shares it, which adds its rows in place
(``hvd_bert.pt.kernels.tied_embedding``: one vocabulary-sized buffer per step instead of
three).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hvd_bert.config.bert import BertConfig
from hvd_bert.weights.portable import WeightsError, fit_for_model, read_run_bert_config, read_weights
from hvd_bert.weights.published import read_published
from hvd_bert.train.checkpoint import SHARDED, latest_checkpoint
from hvd_bert.core.kernels import env_flag
from hvd_bert.data.packing import PACKED_FEATURES, is_packed
from hvd_bert.pt.kernels.dropout import dropout, dropout_add, served
from hvd_bert.pt.kernels.gelu import LinearGELU, bias_gelu
from hvd_bert.pt.kernels.tied_embedding import Tie, lookup, project, tie_for
from hvd_bert.pt.parallel_layers import COLUMN, COPY, ROW

__all__ = ["BertModel", "BertForPreTraining", "BertForSequenceClassification", "BertForQuestionAnswering",
           "pretraining_loss", "packed_features", "classification_loss", "regression_loss", "span_loss",
           "BertForTokenClassification", "token_classification_loss",
           "export_weights", "load_weights", "read_checkpoint_weights"]


class BertEmbeddings(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.padded_vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.p = c.hidden_dropout

    def forward(self, input_ids, segment_ids, tie: Tie | None = None, position_ids=None):
        pos = position_ids if position_ids is not None else torch.arange(input_ids.shape[1],
                                                                         device=input_ids.device)
        x = lookup(self.word_embeddings.weight, input_ids, tie) + self.position_embeddings(pos) + \
            self.token_type_embeddings(segment_ids)
        return dropout(self.LayerNorm(x), self.p, self.training)


def attention(q, k, v, attn_bias, p: float, training: bool):
    """softmax(q k^T / sqrt(d) + bias) v with dropout ``p`` on the probabilities while
    training; written out where the fast dropout serves them (SDPA would draw its own)."""
    if not (training and p > 0.0 and served(q)):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, dropout_p=p if training else 0.0)
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
    if attn_bias is not None:
        scores = scores + attn_bias
    return dropout(torch.softmax(scores, dim=-1), p) @ v


class Segments(NamedTuple):
    """A packed batch's spans (``segment_offsets``: starts in its rows flattened to ``[R * S]``,
    then ``R * S``): varlen attention keeps each span to itself, with no ``[R, S, S]`` mask."""

    offsets: torch.Tensor
    max_len: int  # (the row length: a bound on any span's, known without reading the offsets)


def varlen_attention(q, k, v, spans: Segments, p: float, training: bool, nested: bool | None = None):
    """Attention within each span of the rows (``q``, ``k``, ``v``: ``[R, heads, S, d]``), as
    ``[R, S, heads * d]``. ``nested`` (the default on a GPU, and wherever
    ``HVD_BERT_NESTED_ATTENTION=1``): SDPA on nested jagged tensors
    (``torch.nested``), whose flash and memory-efficient kernels take the spans' offsets, with
    SDPA's own dropout. Otherwise (the CPU, where nested SDPA pads every span to the longest)
    :func:`attention` span by span: the offsets are host memory there, so reading them is free."""
    r, h, s, d = q.shape
    if nested is None:
        nested = q.device.type == "cuda" or os.environ.get("HVD_BERT_NESTED_ATTENTION") == "1"
    if not nested:
        bounds = spans.offsets.tolist()
        flat = [t.transpose(1, 2).reshape(r * s, h, d) for t in (q, k, v)]
        outs = [attention(*(f[lo:hi].transpose(0, 1)[None] for f in flat), None, p, training)[0]
                for lo, hi in zip(bounds[:-1], bounds[1:])]
        return torch.cat([o.transpose(0, 1) for o in outs]).reshape(r, s, h * d)

    def jagged(t):
        flat = t.transpose(1, 2).reshape(r * s, h, d).contiguous()  # (its kernels take dense spans)
        return torch.nested.nested_tensor_from_jagged(flat, spans.offsets, min_seqlen=1,
                                                      max_seqlen=spans.max_len).transpose(1, 2)

    with _quiet_nested():
        out = F.scaled_dot_product_attention(jagged(q), jagged(k), jagged(v),
                                             dropout_p=p if training else 0.0)
    return out.transpose(1, 2).values().reshape(r, s, h * d)


@contextlib.contextmanager
def _quiet_nested():
    """Without the two notices torch's nested tensors print to every user on their first use (a
    log line of torch.fx about its tracing check, and the prototype warning of the CPU path)."""
    fx = logging.getLogger("torch.fx._symbolic_trace")
    level = fx.level
    fx.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype")
            yield
    finally:
        fx.setLevel(level)


class _QKV(torch.autograd.Function):
    """The query, key and value projections as one matrix product, returned in the heads'
    layout ``[B, heads, S, head_size]`` (views of one ``[B*S, 3H]`` output); the backward pass
    gathers the three gradients into one buffer (the head-to-token transpose it had to copy
    anyway) and makes one product for the input gradient (no sum of three) and one for the
    weights, whose gradients are contiguous row blocks of it."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x, nh, wq, bq, wk, bk, wv, bv):
        b, s, h = x.shape
        hq = wq.shape[0]  # the projections' width: h, or this rank's share of it (tensor parallel)
        x2 = x.reshape(b * s, h)
        w = torch.cat((wq, wk, wv))
        y = torch.addmm(torch.cat((bq, bk, bv)), x2, w.t())
        ctx.save_for_backward(x2, w)
        ctx.shape = (b, s, h, hq, nh)
        q, k, v = y.view(b, s, 3, nh, hq // nh).unbind(2)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, dq, dk, dv):
        x2, w = ctx.saved_tensors
        b, s, h, hq, nh = ctx.shape
        dtype = next(g.dtype for g in (dq, dk, dv) if g is not None)
        dy = torch.empty(b, s, 3, nh, hq // nh, dtype=dtype, device=x2.device)
        for i, g in enumerate((dq, dk, dv)):
            if g is None:
                dy[:, :, i].zero_()
            else:
                dy[:, :, i].copy_(g.transpose(1, 2))
        dy = dy.view(b * s, 3 * hq)
        dx = (dy @ w.to(dtype)).view(b, s, h) if ctx.needs_input_grad[0] else None
        dw = (dy.t() @ x2.to(dtype)).to(w.dtype)
        db = dy.sum(0).to(w.dtype)
        h = hq
        return (dx, None, dw[:h], db[:h], dw[h:2 * h], db[h:2 * h], dw[2 * h:], db[2 * h:])


def qkv_heads(x, query: nn.Linear, key: nn.Linear, value: nn.Linear, num_heads: int):
    """``(q, k, v)`` of ``x [B, S, H]`` in the heads' layout ``[B, heads, S, H / heads]``, one
    fused projection (:class:`_QKV`); ``HVD_BERT_FUSED_QKV=0`` makes three."""
    if fused_qkv_enabled():
        return _QKV.apply(x, num_heads, query.weight, query.bias, key.weight, key.bias, value.weight,
                          value.bias)
    b, s, _ = x.shape
    return tuple(m(x).view(b, s, num_heads, -1).transpose(1, 2) for m in (query, key, value))


def fused_qkv_enabled() -> bool:
    """False when ``HVD_BERT_FUSED_QKV`` is ``0``, ``false`` or empty."""
    return env_flag("HVD_BERT_FUSED_QKV")


class BertLayer(nn.Module):
    """One encoder layer. Its tensor-parallel plan (``TP_PLAN``, applied by
    ``hvd_bert.pt.tensor_parallel``): the input copied into the group once per block, the query,
    key, value and first MLP projections split by output features (so the heads and the MLP's
    features are split T ways), the attention output and second MLP projections by input
    features. The same forward runs dense and split: the heads are counted from the query's width."""

    TP_PLAN = {"enter": COPY, "query": COLUMN, "key": COLUMN, "value": COLUMN, "attention_output": ROW,
               "intermediate": COLUMN, "output": ROW}

    def __init__(self, c: BertConfig):
        super().__init__()
        self.c = c
        h = c.hidden_size
        self.enter = nn.Identity()  # (tensor parallel: f, the input's gradient summed over the group)
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.attention_output = nn.Linear(h, h)
        self.attention_LayerNorm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.intermediate = LinearGELU(h, c.intermediate_size, c.gelu)
        self.output = nn.Linear(c.intermediate_size, h)
        self.output_LayerNorm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.recompute_attention = False  # (train.activation_checkpointing=attention)

    def _attention(self, x, attn_bias):
        """The attention block up to the context ``[B, S, H]`` (its scores are the largest
        activation: ``[B, heads, S, S]``)."""
        b, s, h = x.shape
        heads = self.c.num_heads * self.query.weight.shape[0] // h  # (this rank's, when split)
        q, k, v = qkv_heads(self.enter(x), self.query, self.key, self.value, heads)
        if isinstance(attn_bias, Segments):
            return varlen_attention(q, k, v, attn_bias, self.c.attention_dropout, self.training)
        ctx = attention(q, k, v, attn_bias, self.c.attention_dropout, self.training)
        return ctx.transpose(1, 2).reshape(b, s, -1)

    def forward(self, x, attn_bias):
        if self.recompute_attention and self.training and torch.is_grad_enabled():
            ctx = recompute(self._attention, x, attn_bias)
        else:
            ctx = self._attention(x, attn_bias)
        p, train = self.c.hidden_dropout, self.training
        x = self.attention_LayerNorm(dropout_add(self.attention_output(ctx), x, p, train))
        mid = self.intermediate(self.enter(x))
        return self.output_LayerNorm(dropout_add(self.output(mid), x, p, train))


def recompute(fn, *args):
    """``fn(*args)`` whose activations are not kept: the backward pass runs it again, with the
    random state it had (dropout draws the same masks: the gradients are those of ``fn`` kept)."""
    from torch.utils.checkpoint import checkpoint

    # (no determinism check: it reads the shape of every saved tensor, which varlen attention's
    # nested tensors do not have)
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=True, determinism_check="none")


class BertModel(nn.Module):
    """The encoder (embeddings, layers, pooler) the task models share; ``encode`` gives the
    sequence output, ``pool`` the first token's tanh projection. ``activation_checkpointing``
    (``train.activation_checkpointing``) recomputes layers or their attention in the backward
    pass instead of keeping their activations."""

    recompute_every = 0  # (every this many-th layer is recomputed whole; 0: none)

    def activation_checkpointing(self, every: int, attention: bool) -> None:
        """Recompute every ``every``-th encoder layer (0: none), or each layer's attention block."""
        self.recompute_every = every
        for layer in self.layers:
            layer.recompute_attention = attention

    def __init__(self, c: BertConfig, pooler: bool = True):
        super().__init__()
        self.config = c
        self.embeddings = BertEmbeddings(c)
        self.layers = nn.ModuleList(BertLayer(c) for _ in range(c.num_layers))
        self.pooler = nn.Linear(c.hidden_size, c.hidden_size) if pooler else None

    def _init(self, m):
        """BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm."""
        if isinstance(m, (nn.Linear, LinearGELU)):
            nn.init.normal_(m.weight, 0.0, self.config.initializer_range)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, self.config.initializer_range)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def encode(self, input_ids, segment_ids, input_mask, tie: Tie | None = None, packed: dict | None = None):
        """The sequence output; ``tie`` hands the tied decoder's weight gradient to the word
        embeddings (``hvd_bert.pt.kernels.tied_embedding``); ``packed``: rows holding several
        sequences (``hvd_bert.data.packing``), given their ``position_ids`` and ``sequence_ids``."""
        x = self.embeddings(input_ids, segment_ids, tie, None if packed is None else packed["position_ids"])
        # additive attention bias: 0 where attended, a large negative where padded (packed: also
        # between the sequences that share a row)
        if packed is not None and "segment_offsets" in packed:  # (varlen: the spans, no mask)
            attn_bias = Segments(packed["segment_offsets"], input_ids.shape[1])
        else:
            if packed is None:
                attend = input_mask[:, None, None, :].bool()
            else:
                seq = packed["sequence_ids"]
                attend = (seq[:, None, :, None] == seq[:, None, None, :]) & (seq[:, None, None, :] > 0)
            attn_bias = (~attend).to(x.dtype) * torch.finfo(x.dtype).min
        keep = not (self.recompute_every and self.training and torch.is_grad_enabled())
        for i, layer in enumerate(self.layers):
            if keep or (i + 1) % self.recompute_every:
                x = layer(x, attn_bias)
            else:
                x = recompute(layer, x, attn_bias)
        return x

    def compile_layers(self) -> None:
        """``torch.compile`` each encoder layer in place (``nn.Module.compile``: the parameter
        names, and so the checkpoints, stay): on a GPU its bias, dropout, residual and LayerNorm
        kernels fuse. A new batch shape (packed rows) compiles again, then shapes go dynamic."""
        for layer in self.layers:
            layer.compile(dynamic=None)

    def pool(self, x, cls_positions=None):
        """The first token's tanh projection (packed rows: at each sequence's ``cls_positions``)."""
        first = x[:, 0] if cls_positions is None else x.flatten(0, 1)[cls_positions]
        return torch.tanh(self.pooler(first))


class BertForPreTraining(BertModel):
    """BERT with the masked-LM head (decoder tied to the word embeddings) and the
    next-sentence head. ``forward`` returns ``(mlm_logits [B, P, V], nsp_logits [B, 2])``,
    the MLM logits only at ``masked_lm_positions``. ``packed``: the batch's rows hold several
    sequences (``hvd_bert.data.packing``): ``masked_lm_positions`` index the flattened rows, and
    the logits are per sequence as for the unpacked batch."""

    def __init__(self, c: BertConfig):
        super().__init__(c)
        self.mlm_transform = nn.Linear(c.hidden_size, c.hidden_size)
        self.mlm_LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.mlm_bias = nn.Parameter(torch.zeros(c.padded_vocab_size))
        self.nsp = nn.Linear(c.hidden_size, 2)
        self.apply(self._init)

    def forward(self, input_ids, segment_ids, input_mask, masked_lm_positions, packed: dict | None = None):
        word = self.embeddings.word_embeddings.weight
        tie = tie_for(word)
        x = self.encode(input_ids, segment_ids, input_mask, tie, packed)
        pooled = self.pool(x, None if packed is None else packed["cls_positions"])
        # the MLM head only where tokens were masked: gather first, then transform
        if packed is None:
            m = torch.gather(x, 1, masked_lm_positions.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        else:
            m = x.flatten(0, 1)[masked_lm_positions]
        m = self.mlm_LayerNorm(bias_gelu(F.linear(m, self.mlm_transform.weight), self.mlm_transform.bias,
                                         self.config.gelu))
        mlm_logits = project(m, word, self.mlm_bias, tie)
        return mlm_logits, self.nsp(pooled)


def pretraining_loss(model: BertForPreTraining, batch: dict) -> tuple[torch.Tensor, dict]:
    """Masked-LM cross-entropy over the real predictions (``masked_lm_weights``) plus the
    next-sentence cross-entropy; also returns MLM accuracy."""
    mlm, nsp = model(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                     batch["masked_lm_positions"], packed_features(batch))
    w = batch["masked_lm_weights"].float()
    ce = F.cross_entropy(mlm.float().flatten(0, 1), batch["masked_lm_ids"].flatten(), reduction="none")
    mlm_loss = (ce * w.flatten()).sum() / w.sum().clamp_min(1.0)
    nsp_loss = F.cross_entropy(nsp.float(), batch["next_sentence_labels"].view(-1))
    with torch.no_grad():
        correct = (mlm.argmax(-1) == batch["masked_lm_ids"]).float()
        acc = (correct * w).sum() / w.sum().clamp_min(1.0)
    return mlm_loss + nsp_loss, {"mlm_loss": mlm_loss.detach(), "nsp_loss": nsp_loss.detach(),
                                 "mlm_accuracy": acc}


class BertForSequenceClassification(BertModel):
    """BERT with a classifier on the pooled first token (Google's run_classifier):
    ``forward`` returns logits ``[B, num_labels]``."""

    def __init__(self, c: BertConfig, num_labels: int):
        super().__init__(c)
        self.dropout = nn.Dropout(c.hidden_dropout)
        self.classifier = nn.Linear(c.hidden_size, num_labels)
        self.apply(self._init)

    def forward(self, input_ids, segment_ids, input_mask):
        return self.classifier(self.dropout(self.pool(self.encode(input_ids, segment_ids, input_mask))))


class BertForQuestionAnswering(BertModel):
    """BERT with SQuAD's span head (Google's run_squad, Hugging Face's ``qa_outputs``): a
    linear layer to two logits per token; ``forward`` returns ``(start_logits, end_logits)``,
    each ``[B, S]``, in float32. It has no pooler (nothing would train it)."""

    def __init__(self, c: BertConfig):
        super().__init__(c, pooler=False)
        self.qa_outputs = nn.Linear(c.hidden_size, 2)
        self.apply(self._init)

    def forward(self, input_ids, segment_ids, input_mask):
        logits = self.qa_outputs(self.encode(input_ids, segment_ids, input_mask)).float()
        return logits[..., 0], logits[..., 1]


class BertForTokenClassification(BertModel):
    """BERT with a label for every token (NER; Hugging Face's ``BertForTokenClassification``): a
    linear layer on each position of the sequence output; ``forward`` returns logits
    ``[B, S, num_labels]``. It has no pooler (nothing would train it)."""

    def __init__(self, c: BertConfig, num_labels: int):
        super().__init__(c, pooler=False)
        self.dropout = nn.Dropout(c.hidden_dropout)
        self.classifier = nn.Linear(c.hidden_size, num_labels)
        self.apply(self._init)

    def forward(self, input_ids, segment_ids, input_mask):
        return self.classifier(self.dropout(self.encode(input_ids, segment_ids, input_mask)))


def packed_features(batch: dict) -> dict | None:
    """The packed layout's features of a batch (``hvd_bert.data.packing``), or None."""
    return {k: batch[k] for k in PACKED_FEATURES if k in batch} if is_packed(batch) else None


def classification_loss(model: BertForSequenceClassification, batch: dict) -> tuple[torch.Tensor, dict]:
    logits = model(batch["input_ids"], batch["segment_ids"], batch["input_mask"])
    labels = batch["label_ids"].view(-1)
    loss = F.cross_entropy(logits.float(), labels)
    acc = (logits.argmax(-1) == labels).float().mean()
    return loss, {"accuracy": acc}


def regression_loss(model: BertForSequenceClassification, batch: dict) -> tuple[torch.Tensor, dict]:
    """Mean squared error of a one-output head (STS-B)."""
    pred = model(batch["input_ids"], batch["segment_ids"], batch["input_mask"]).float().view(-1)
    loss = F.mse_loss(pred, batch["label_values"].float().view(-1))
    return loss, {}


def token_classification_loss(model: BertForTokenClassification, batch: dict) -> tuple[torch.Tensor, dict]:
    """The cross-entropy over the labelled positions (each word's first piece; ``label_ids`` -1
    elsewhere), and their accuracy; no host synchronisation."""
    logits = model(batch["input_ids"], batch["segment_ids"], batch["input_mask"]).float()
    labels = batch["label_ids"].long()
    keep = (labels >= 0).float()
    n = keep.sum().clamp_min(1.0)
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-1, reduction="sum") / n
    acc = ((logits.argmax(-1) == labels).float() * keep).sum() / n
    return loss, {"accuracy": acc.detach()}


def span_loss(model: BertForQuestionAnswering, batch: dict) -> tuple[torch.Tensor, dict]:
    """Google's run_squad loss: the mean of the start and end cross-entropies over the
    sequence positions; also the fraction of exactly predicted spans."""
    start, end = model(batch["input_ids"], batch["segment_ids"], batch["input_mask"])
    s, e = batch["start_positions"].view(-1), batch["end_positions"].view(-1)
    loss = (F.cross_entropy(start, s) + F.cross_entropy(end, e)) / 2
    with torch.no_grad():
        exact = ((start.argmax(-1) == s) & (end.argmax(-1) == e)).float().mean()
    return loss, {"span_accuracy": exact}


# ---------------------------------------------------------------------- portable weights
def export_weights(model: nn.Module) -> dict[str, np.ndarray]:
    """The model's parameters as float32 numpy arrays under their ``state_dict`` names (the
    portable names of ``hvd_bert.weights.portable``)."""
    return {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}


def load_weights(model: nn.Module, arrays: dict[str, np.ndarray], *, source: str = "weights") -> None:
    """Load portable weights, checked name by name. A classifier takes the encoder of a
    pretraining checkpoint (its own classifier keeps its initialisation)."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    task_model = isinstance(model, (BertForSequenceClassification, BertForQuestionAnswering,
                                    BertForTokenClassification))
    fitted = fit_for_model(arrays, expected, classifier=task_model, source=source)
    state = model.state_dict()
    with torch.no_grad():
        for k, a in fitted.items():
            state[k].copy_(torch.from_numpy(np.ascontiguousarray(a)).to(state[k].dtype))


def read_checkpoint_weights(path: str | Path) -> tuple[dict[str, np.ndarray], BertConfig | None]:
    """Portable weights from a portable ``.npz``, a PyTorch checkpoint ``ckpt-*.pt``, a sharded
    checkpoint ``ckpt-*.shards`` of either framework (its tensors read one at a time, when used)
    or a run folder (its newest of those). TensorFlow's own checkpoints: convert them first with
    ``hvd-bert convert``."""
    from hvd_bert.pt.checkpoint import load_state_dict_file

    p = Path(path).expanduser()
    published = read_published(p, load_state_dict_file, _read_google_in_tf_process)  # HF, Google
    if published is not None:
        return published
    if p.suffix == ".tf" and p.is_dir():
        raise WeightsError(f"{p} is a TensorFlow checkpoint: give --framework tf to read it with "
                           f"TensorFlow, or convert it with `hvd-bert convert {p} --output weights.npz` and "
                           f"give the .npz")
    if p.is_dir() and p.suffix != f".{SHARDED}":
        found = latest_checkpoint(p, ("pt", SHARDED))
        if found is None:
            raise WeightsError(f"{p} is neither a run folder with a ckpt-*.pt checkpoint nor a Hugging Face "
                               f"model folder (config.json + model.safetensors or pytorch_model.bin); give "
                               f"one of those, a checkpoint file or a .npz from `hvd-bert convert`")
        p = found
    if p.suffix == ".npz":
        return read_weights(p)
    if p.suffix == f".{SHARDED}" and p.is_dir():  # tensor by tensor, the optimizer state left unread
        from hvd_bert.train.sharded_checkpoint import model_weights

        return model_weights(p)
    if p.suffix == ".tf" or p.is_dir():
        raise WeightsError(f"{p} is a TensorFlow checkpoint; convert it with `hvd-bert convert {p} "
                           f"--output weights.npz` and give the .npz")
    if not p.is_file():
        raise WeightsError(f"checkpoint {p} does not exist; give runs/<run>/ckpt-<step>.pt, a run "
                           f"folder or a .npz")
    from hvd_bert.train.engine import CheckpointError
    from hvd_bert.pt.checkpoint import load_checkpoint_file

    try:
        state = load_checkpoint_file(p)
    except CheckpointError as e:
        raise WeightsError(str(e)) from None
    return {k: v.float().numpy() for k, v in state["model"].items()}, read_run_bert_config(p.parent)


def _read_google_in_tf_process(path: Path) -> tuple[dict[str, np.ndarray], BertConfig]:
    """A Google TF1 checkpoint needs TensorFlow's reader: it runs in its own process
    (``hvd_bert.tf.google_ckpt``), which streams the portable weights into a safetensors file; it
    is read from here lazily (a rank's share of each tensor), kept open after its folder goes."""
    import subprocess
    import sys
    import tempfile

    from hvd_bert.weights.google import google_checkpoint_prefix, read_google_config
    from hvd_bert.weights.lazy import SafetensorsTensors

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "weights.safetensors"
        res = subprocess.run([sys.executable, "-m", "hvd_bert.tf.google_ckpt", "to-safetensors", str(path),
                              str(out)], capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
            raise WeightsError(lines[-1] if lines else f"reading the Google checkpoint {path} failed")
        return SafetensorsTensors(out), read_google_config(google_checkpoint_prefix(path).parent)
