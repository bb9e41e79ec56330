"""ZeRO stages 1 and 2 over Horovod for the PyTorch engine (``train.zero.stage``).

Every rank keeps the whole model; the optimizer state is split over the N data-parallel ranks
by :mod:`hvd_bert.core.zero`'s flat partition (the parameters flattened in order, padded to a
multiple of N, rank r owning elements ``[r S, (r + 1) S)``):

* **stage 1**: the k micro-batches accumulate into the parameters' ``.grad`` as without
  Horovod; at the k-th, one reduce-scatter (an average) leaves each rank the reduced gradient
  of its shard. **Stage 2** reduce-scatters after every micro-batch into a shard accumulator
  and frees ``.grad``: between micro-batches a rank holds 1/N of the gradients, at k times the
  reduce-scatters.
* The reduce-scatter and the allgather of the updated parameters go out in buckets of
  ``train.zero.bucket_mb`` (a bucket is a band of columns of the N x S layout, so each rank's
  part of it is a piece of its own shard), several in flight so that Horovod fuses them.
* The step on the shard is :func:`hvd_bert.core.zero.sharded_step`'s: per-tensor partial sums
  of squares of the weights, and the total of the gradient's, completed by one small allreduce;
  LAMB's update norms by a second. A non-finite total on any rank is non-finite on every rank,
  so every rank skips the same steps (fp16: the loss scale backs off alike).
* Checkpoints hold the optimizer state as the unsharded optimizer's ``state_dict`` (what stage
  0 writes): rank 0 receives it buffer by buffer, shard by shard, and a resume sends each rank
  its shard of whatever the file holds, so a run resumes at any stage and on any world size.
"""

from __future__ import annotations

import collections
import math
from typing import Callable

import torch
import horovod.torch as hvd

from hvd_bert.core import zero as Z
from hvd_bert.pt.optim import Lamb, Lars

__all__ = ["ShardedOptimizer", "state_bytes", "update_loss_scale", "SUPPORTED"]

SUPPORTED = "lamb, nvlamb, lars, adamw and sgd"
IN_FLIGHT = 4  # buckets queued to Horovod at once (it fuses what is queued in one cycle)


def _kind(opt: torch.optim.Optimizer) -> tuple[str, tuple[str, ...], bool]:
    """(the update, the state buffers, whether the state has a step) of a supported optimizer."""
    if isinstance(opt, Lamb):
        return "lamb", ("exp_avg", "exp_avg_sq"), True
    if isinstance(opt, Lars):
        return "lars", ("momentum_buffer",), True
    if isinstance(opt, torch.optim.AdamW):
        bad = [k for k in ("amsgrad", "maximize", "capturable") if any(g.get(k) for g in opt.param_groups)]
        if not bad:
            return "adamw", ("exp_avg", "exp_avg_sq"), True
    elif isinstance(opt, torch.optim.SGD):
        bad = [k for k in ("dampening", "maximize") if any(g.get(k) for g in opt.param_groups)]
        if not bad:
            momentum = any(g.get("momentum", 0) for g in opt.param_groups)
            return "sgd", ("momentum_buffer",) if momentum else (), False
    raise ValueError(f"train.zero.stage > 0 supports {SUPPORTED} (as hvd_bert builds them), "
                     f"not {type(opt).__name__} with these options")


class ShardedOptimizer:
    """The optimizer state of this rank's shard, and the collectives of a ZeRO step.

    ``optimizer`` is the unsharded optimizer over the model's parameters: its parameter groups
    give the hyperparameters (the engine sets their ``lr``), and it holds state only in a
    resume, on rank 0, for as long as the shards take to go out."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, stage: int, compression: str = "none",
                 bucket_mb: float = 32.0, process_set=None):
        self.optimizer = optimizer
        self.stage = stage
        self.kind, self.buffers, self.has_step = _kind(optimizer)
        self.process_set = process_set if process_set is not None else hvd.global_process_set
        self.rank, self.size = self.process_set.rank(), self.process_set.size()
        self.compression = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
        self.params, self.group_of = [], []
        for gi, group in enumerate(optimizer.param_groups):
            self.params += list(group["params"])
            self.group_of += [gi] * len(group["params"])
        self.part = Z.partition([p.numel() for p in self.params], self.size)
        self.starts = [0]
        for p in self.params:
            self.starts.append(self.starts[-1] + p.numel())
        self.pieces = self.part.pieces(self.rank)
        self.bucket = max(1, int(bucket_mb * (1 << 20)) // 4 // self.size)  # columns of the N x S layout
        like = self.params[0]
        self.state = {n: torch.zeros(self.part.shard, dtype=like.dtype, device=like.device)
                      for n in self.buffers}
        self.step_count = 0
        self.grad_shard: torch.Tensor | None = None

    # ------------------------------------------------------------------ sizes
    def state_bytes(self) -> int:
        """The bytes of this rank's optimizer state (its shard of every buffer)."""
        return sum(t.numel() * t.element_size() for t in self.state.values())

    # ------------------------------------------------------------------ flat ranges
    def _spans(self, lo: int, hi: int):
        """``(tensor, offset in it, offset in [lo, hi), length)`` over the flat range [lo, hi)."""
        for i in range(len(self.params)):
            a, b = max(lo, self.starts[i]), min(hi, self.starts[i + 1])
            if a < b:
                yield i, a - self.starts[i], a - lo, b - a

    def _read(self, tensors: list, lo: int, hi: int, out: torch.Tensor) -> None:
        out.zero_()
        for i, off, pos, n in self._spans(lo, hi):
            if tensors[i] is not None:
                out[pos:pos + n].copy_(tensors[i].reshape(-1)[off:off + n])

    def _write(self, tensors: list, lo: int, hi: int, src: torch.Tensor) -> None:
        for i, off, pos, n in self._spans(lo, hi):
            tensors[i].view(-1)[off:off + n].copy_(src[pos:pos + n])

    def _columns(self):
        s = self.part.shard
        return [(c, min(c + self.bucket, s)) for c in range(0, s, self.bucket)]

    def _pipelined(self, blocks, submit: Callable, finish: Callable) -> None:
        """Submit the buckets asynchronously, at most IN_FLIGHT at a time, finishing in order."""
        queue = collections.deque()
        for block in blocks:
            queue.append((block, submit(block)))
            if len(queue) >= IN_FLIGHT:
                finish(*queue.popleft())
        while queue:
            finish(*queue.popleft())

    # ------------------------------------------------------------------ gradients
    def reduce_scatter_grads(self) -> None:
        """Add this rank's shard of the average over ranks of the parameters' ``.grad`` to the
        shard accumulator, and free ``.grad`` (a collective)."""
        s, n = self.part.shard, self.size
        grads = [p.grad for p in self.params]
        if self.grad_shard is None:
            self.grad_shard = torch.zeros(s, dtype=self.params[0].dtype, device=self.params[0].device)

        def submit(cols):
            a, b = cols
            block = torch.empty(n, b - a, dtype=self.grad_shard.dtype, device=self.grad_shard.device)
            for r in range(n):
                self._read(grads, r * s + a, r * s + b, block[r])
            wire, ctx = self.compression.compress(block)
            return ctx, hvd.reducescatter_async(wire, name=f"hvd_bert.zero.rs.{a}", op=hvd.Average,
                                                process_set=self.process_set)

        def finish(cols, handle):
            ctx, h = handle
            part = self.compression.decompress(hvd.synchronize(h), ctx)
            self.grad_shard[cols[0]:cols[1]].add_(part.reshape(-1).to(self.grad_shard.dtype))

        self._pipelined(self._columns(), submit, finish)
        for p in self.params:
            p.grad = None

    def discard_grads(self) -> None:
        self.grad_shard = None
        for p in self.params:
            p.grad = None

    # ------------------------------------------------------------------ parameters
    def _shard_of_params(self) -> torch.Tensor:
        lo, hi = self.part.bounds(self.rank)
        w = torch.empty(self.part.shard, dtype=self.params[0].dtype, device=self.params[0].device)
        with torch.no_grad():
            self._read([p.detach() for p in self.params], lo, hi, w)
        return w

    def allgather_params(self, w: torch.Tensor) -> None:
        """Every rank's updated shard into every rank's parameters (a collective)."""
        s = self.part.shard
        targets = [p.detach() for p in self.params]

        def submit(cols):
            a, b = cols
            return hvd.allgather_async(w[a:b].reshape(1, -1).contiguous(), name=f"hvd_bert.zero.ag.{a}",
                                       process_set=self.process_set)

        def finish(cols, handle):
            a, b = cols
            full = hvd.synchronize(handle)
            for r in range(self.size):
                lo, hi = r * s + a, min(r * s + b, self.part.total)
                if lo < hi:
                    self._write(targets, lo, hi, full[r, :hi - lo])

        with torch.no_grad():
            self._pipelined(self._columns(), submit, finish)

    # ------------------------------------------------------------------ the step
    def _piece_sq(self, flat: torch.Tensor) -> torch.Tensor:
        """Per tensor, the sum of squares of this rank's piece of ``flat`` (float64)."""
        out = torch.zeros(len(self.params), dtype=torch.float64)
        for i, _, pos, n in self.pieces:
            out[i] = torch.linalg.vector_norm(flat[pos:pos + n], dtype=torch.float64).item() ** 2
        return out

    def _allreduce(self, values: torch.Tensor, name: str) -> torch.Tensor:
        return hvd.allreduce(values, op=hvd.Sum, name=name, process_set=self.process_set)

    def _group(self, i: int) -> dict:
        return self.optimizer.param_groups[self.group_of[i]]

    @torch.no_grad()
    def step(self, *, inv_scale: float = 1.0, max_grad_norm: float | None = None) -> tuple[bool, float]:
        """Reduce-scatter what is left, then one step on this rank's shard and the allgather.
        Returns ``(finite, gradient norm)``; on a non-finite norm nothing changes on any rank."""
        if self.stage == 1 or any(p.grad is not None for p in self.params):
            self.reduce_scatter_grads()
        g = self.grad_shard
        self.grad_shard = None
        if inv_scale != 1.0:
            g.mul_(inv_scale)
        w = self._shard_of_params()
        k = len(self.params)
        needs_w = self.kind in ("lamb", "lars")
        parts = [self._piece_sq(w)] if needs_w else []
        if self.kind == "lars":
            parts.append(self._piece_sq(g))
        parts.append(torch.tensor([torch.dot(g.double(), g.double()).item()], dtype=torch.float64))
        first = self._allreduce(torch.cat(parts), "hvd_bert.zero.norms")
        gnorm = math.sqrt(first[-1].item()) if math.isfinite(first[-1].item()) else float("inf")
        if not math.isfinite(gnorm):
            return False, gnorm
        group0 = self.optimizer.param_groups[0]
        limit = group0.get("max_grad_norm") if self.kind == "lamb" else None
        limit = limit if limit is not None else max_grad_norm
        clip = max_grad_norm_factor(gnorm, limit)
        if clip != 1.0:
            g.mul_(clip)
        self.step_count += 1
        wn = first[:k].sqrt() if needs_w else None
        if self.kind == "lamb":
            self._lamb(w, g, wn)
        elif self.kind == "lars":
            self._lars(w, g, wn, first[k:2 * k].sqrt() * clip)
        elif self.kind == "adamw":
            self._adamw(w, g)
        else:
            self._sgd(w, g)
        self.allgather_params(w)
        return True, gnorm

    def _views(self, flat: torch.Tensor):
        return [(i, flat[pos:pos + n]) for i, _, pos, n in self.pieces]

    def _lamb(self, w, g, wn) -> None:
        opt, t = self.optimizer, self.step_count
        g0 = opt.param_groups[0]
        beta1, beta2 = g0["betas"]
        c1, c2 = (1.0 - beta1 ** t, 1.0 - beta2 ** t) if g0["bias_correction"] else (1.0, 1.0)
        m, v = self.state["exp_avg"], self.state["exp_avg_sq"]
        m.lerp_(g, 1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        u = torch.addcdiv(torch.zeros_like(w), m, v.sqrt().mul_(1.0 / math.sqrt(c2)).add_(g0["eps"]),
                          value=1.0 / c1)
        for (i, up), (_, wp) in zip(self._views(u), self._views(w)):
            wd = self._group(i)["weight_decay"]
            if wd:
                up.add_(wp, alpha=wd)
        un = self._allreduce(self._piece_sq(u), "hvd_bert.zero.update_norms").sqrt()
        for (i, up), (_, wp) in zip(self._views(u), self._views(w)):
            group = self._group(i)
            ratio = 1.0
            if opt._adapt(group) and wn[i] > 0 and un[i] > 0:
                ratio = float(wn[i] / un[i])
            wp.add_(up, alpha=-group["lr"] * ratio)

    def _lars(self, w, g, wn, gn) -> None:
        buf = self.state["momentum_buffer"]
        for (i, gp), (_, wp), (_, vp) in zip(self._views(g), self._views(w), self._views(buf)):
            group = self._group(i)
            lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
            vp.mul_(mu)
            if group["adapt"]:
                trust = 1.0
                if wn[i] > 0 and gn[i] > 0:
                    trust = float(group["eta"] * wn[i] / max(float(gn[i] + wd * wn[i] + group["eps"]), 1e-38))
                vp.add_(gp.add(wp, alpha=wd) if wd else gp, alpha=lr * trust)
            else:
                vp.add_(gp, alpha=lr)
            wp.sub_(vp)

    def _adamw(self, w, g) -> None:
        t = self.step_count
        m, v = self.state["exp_avg"], self.state["exp_avg_sq"]
        for i, wp in self._views(w):
            group = self._group(i)
            wp.mul_(1.0 - group["lr"] * group["weight_decay"])
        g0 = self.optimizer.param_groups[0]
        beta1, beta2 = g0["betas"]
        m.lerp_(g, 1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        denom = v.sqrt().div_(math.sqrt(1.0 - beta2 ** t)).add_(g0["eps"])
        for i, _, pos, n in self.pieces:
            w[pos:pos + n].addcdiv_(m[pos:pos + n], denom[pos:pos + n],
                                    value=-self._group(i)["lr"] / (1.0 - beta1 ** t))

    def _sgd(self, w, g) -> None:
        buf = self.state.get("momentum_buffer")
        for i, _, pos, n in self.pieces:
            group = self._group(i)
            wp, d = w[pos:pos + n], g[pos:pos + n]
            if group["weight_decay"]:
                d = d.add(wp, alpha=group["weight_decay"])
            if buf is not None and group["momentum"]:
                bp = buf[pos:pos + n]
                bp.mul_(group["momentum"]).add_(d)
                d = d.add(bp, alpha=group["momentum"]) if group["nesterov"] else bp
            wp.add_(d, alpha=-group["lr"])

    # ------------------------------------------------------------------ checkpoints
    def consolidated_state_dict(self) -> dict | None:
        """The unsharded optimizer's ``state_dict`` on rank 0 (None elsewhere), received buffer
        by buffer, shard by shard (a collective)."""
        full = {}
        for name in self.buffers:
            flat = None
            if self.rank == 0:
                flat = torch.empty(self.part.shard * self.size, dtype=self.state[name].dtype)
            for r in range(self.size):
                shard = self.state[name] if r == self.rank else torch.empty_like(self.state[name])
                got = hvd.broadcast(shard, root_rank=r, name=f"hvd_bert.zero.save.{name}.{r}",
                                    process_set=self.process_set)
                if flat is not None:
                    lo, hi = self.part.bounds(r)
                    flat[lo:hi].copy_(got.cpu())
            full[name] = flat
        if self.rank != 0:
            return None
        sd = self.optimizer.state_dict()
        state = {}
        for i, p in enumerate(self.params):
            entry = {}
            if self.has_step:
                entry["step"] = torch.tensor(float(self.step_count), dtype=torch.float32)
            for name in self.buffers:
                entry[name] = full[name][self.starts[i]:self.starts[i + 1]].view(p.shape)
            state[i] = entry
        sd["state"] = state
        return sd

    def load_sharded(self, state_dict: dict | None) -> None:
        """This rank's shard of a stage-0-format optimizer state that rank 0 holds (a
        collective; ``state_dict`` is read on rank 0 only)."""
        step = None
        if self.rank == 0:
            states = [state_dict["state"].get(i, {}) for i in range(len(self.params))]
            step = int(float(states[0]["step"])) if self.has_step and states and "step" in states[0] else 0
        self.step_count = hvd.broadcast_object(step, root_rank=0, name="hvd_bert.zero.load.step",
                                               process_set=self.process_set)
        for name in self.buffers:
            for r in range(self.size):
                shard = torch.zeros_like(self.state[name])
                if self.rank == 0:
                    lo, hi = self.part.bounds(r)
                    self._read([s.get(name) for s in states], lo, hi, shard)
                got = hvd.broadcast(shard, root_rank=0, name=f"hvd_bert.zero.load.{name}.{r}",
                                    process_set=self.process_set)
                if r == self.rank:
                    self.state[name].copy_(got)

    def local_state(self) -> dict:
        return {"step": self.step_count, **{n: t.detach().clone() for n, t in self.state.items()}}

    def set_local_state(self, snap: dict) -> None:
        self.step_count = snap["step"]
        for n in self.buffers:
            self.state[n].copy_(snap[n])


def max_grad_norm_factor(gnorm: float, limit: float | None) -> float:
    """min(1, limit / norm): the clip of a global gradient norm (1 without a limit)."""
    return limit / gnorm if limit is not None and gnorm > limit else 1.0


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes of a plain optimizer's state buffers (its per-tensor step counters left out)."""
    return sum(t.numel() * t.element_size() for st in optimizer.state.values() for t in st.values()
               if isinstance(t, torch.Tensor) and t.dim() > 0)


def update_loss_scale(scaler: torch.amp.GradScaler, finite: bool) -> None:
    """GradScaler's own update (back off on an overflow, grow after growth_interval clean
    steps) for a step whose overflow check was the all-ranks norm, not ``scaler.unscale_``."""
    found_inf = torch.tensor([0.0 if finite else 1.0], device=scaler._scale.device)
    torch._amp_update_scale_(scaler._scale, scaler._growth_tracker, found_inf, scaler.get_growth_factor(),
                             scaler.get_backoff_factor(), scaler.get_growth_interval())
