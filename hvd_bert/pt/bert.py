"""BERT for pretraining in PyTorch (``BertForPreTraining``'s parameter names and
initialisation), free of parallelism: the engine applies Horovod from outside.

Speed-ups: the intermediate layer's bias + GELU is one fused kernel
(``hvd_bert.pt.kernels``), attention uses ``scaled_dot_product_attention``, and the
masked-LM head (transform + vocabulary projection) runs only at the masked positions (about
15% of tokens) instead of over every token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hvd_bert.common.bert_config import BertConfig
from hvd_bert.pt.kernels import LinearGELU, bias_gelu

__all__ = ["BertForPreTraining", "pretraining_loss"]


class BertEmbeddings(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.padded_vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout)

    def forward(self, input_ids, segment_ids):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos) + \
            self.token_type_embeddings(segment_ids)
        return self.dropout(self.LayerNorm(x))


class BertLayer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.c = c
        h = c.hidden_size
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.attention_output = nn.Linear(h, h)
        self.attention_LayerNorm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.intermediate = LinearGELU(h, c.intermediate_size, c.gelu)
        self.output = nn.Linear(c.intermediate_size, h)
        self.output_LayerNorm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout)

    def forward(self, x, attn_bias):
        b, s, h = x.shape
        nh, hs = self.c.num_heads, self.c.head_size

        def heads(t):
            return t.view(b, s, nh, hs).transpose(1, 2)

        ctx = F.scaled_dot_product_attention(
            heads(self.query(x)), heads(self.key(x)), heads(self.value(x)), attn_mask=attn_bias,
            dropout_p=self.c.attention_dropout if self.training else 0.0)
        ctx = ctx.transpose(1, 2).reshape(b, s, h)
        x = self.attention_LayerNorm(x + self.dropout(self.attention_output(ctx)))
        return self.output_LayerNorm(x + self.dropout(self.output(self.intermediate(x))))


class BertForPreTraining(nn.Module):
    """BERT with the masked-LM head (decoder tied to the word embeddings) and the
    next-sentence head. ``forward`` returns ``(mlm_logits [B, P, V], nsp_logits [B, 2])``,
    the MLM logits only at ``masked_lm_positions``."""

    def __init__(self, c: BertConfig):
        super().__init__()
        self.config = c
        self.embeddings = BertEmbeddings(c)
        self.layers = nn.ModuleList(BertLayer(c) for _ in range(c.num_layers))
        self.pooler = nn.Linear(c.hidden_size, c.hidden_size)
        self.mlm_transform = nn.Linear(c.hidden_size, c.hidden_size)
        self.mlm_LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.mlm_bias = nn.Parameter(torch.zeros(c.padded_vocab_size))
        self.nsp = nn.Linear(c.hidden_size, 2)
        self.apply(self._init)

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

    def encode(self, input_ids, segment_ids, input_mask):
        x = self.embeddings(input_ids, segment_ids)
        # additive attention bias: 0 where attended, a large negative where padded
        attn_bias = (1.0 - input_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, attn_bias)
        return x

    def forward(self, input_ids, segment_ids, input_mask, masked_lm_positions):
        x = self.encode(input_ids, segment_ids, input_mask)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        # the MLM head only where tokens were masked: gather first, then transform
        idx = masked_lm_positions.unsqueeze(-1).expand(-1, -1, x.shape[-1])
        m = torch.gather(x, 1, idx)
        m = self.mlm_LayerNorm(bias_gelu(F.linear(m, self.mlm_transform.weight), self.mlm_transform.bias,
                                         self.config.gelu))
        mlm_logits = F.linear(m, self.embeddings.word_embeddings.weight, self.mlm_bias)
        return mlm_logits, self.nsp(pooled)


def pretraining_loss(model: BertForPreTraining, batch: dict) -> tuple[torch.Tensor, dict]:
    """Masked-LM cross-entropy over the real predictions (``masked_lm_weights``) plus the
    next-sentence cross-entropy; also returns MLM accuracy."""
    mlm, nsp = model(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                     batch["masked_lm_positions"])
    w = batch["masked_lm_weights"].float()
    ce = F.cross_entropy(mlm.float().flatten(0, 1), batch["masked_lm_ids"].flatten(), reduction="none")
    mlm_loss = (ce * w.flatten()).sum() / w.sum().clamp_min(1.0)
    nsp_loss = F.cross_entropy(nsp.float(), batch["next_sentence_labels"].view(-1))
    with torch.no_grad():
        correct = (mlm.argmax(-1) == batch["masked_lm_ids"]).float()
        acc = (correct * w).sum() / w.sum().clamp_min(1.0)
    return mlm_loss + nsp_loss, {"mlm_loss": mlm_loss.detach(), "nsp_loss": nsp_loss.detach(),
                                 "mlm_accuracy": acc}
