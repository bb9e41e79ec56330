"""ZeRO stages 1 and 2 over Horovod for the PyTorch engine (``train.zero.stage``).

Every rank keeps the whole model; the optimizer state is split over the N data-parallel ranks
by :mod:`hvd_bert.core.zero`'s flat partition (the parameters flattened in order, padded to a
multiple of N, rank r owning elements ``[r S, (r + 1) S)``):

* **stage 1**: the gradients are allreduced by Horovod's ``DistributedOptimizer`` as at stage 0
  (during the backward pass, fused); each rank then updates its shard of the weights from its
  part of ``.grad`` and the updated shards are allgathered.
* **stage 2**: the flat gradient is cut into contiguous buckets (``train.zero.bucket_mb``); a
  hook on every parameter sends a bucket as soon as the backward pass has produced all of it
  and frees each ``.grad`` once its buckets are on the wire, so the whole gradient never exists
  at once; each rank adds its part of each reduced bucket to its shard accumulator. A bucket is
  allreduced, not reduce-scattered: Horovod's reduce-scatter cuts a tensor into equal parts,
  which a contiguous bucket's parts of the shards are not (and under Gloo Horovod 0.28.1's CPU
  reduce-scatter takes 1.6x an allreduce, BENCHMARKS.md). It costs an allreduce's bytes per
  micro-batch.
* The allgather of the updated weights goes out in bands of columns of the N x S layout (each
  rank's part of a band is a piece of its own shard), several at once, which Horovod fuses.
* The step on the shard is :func:`hvd_bert.core.zero.sharded_step`'s: per-tensor partial sums
  of squares of the weights, and the total of the gradient's, completed by one small allreduce;
  LAMB's update norms by a second. A non-finite total on any rank is non-finite on every rank,
  so every rank skips the same steps (fp16: the loss scale backs off alike).
* Checkpoints: consolidated ones hold the optimizer state as the unsharded optimizer's
  ``state_dict`` (what stage 0 writes): rank 0 receives it buffer by buffer, shard by shard, and
  a resume sends each rank its shard of whatever the file holds. Sharded ones
  (``hvd_bert.pt.sharded``) are written and read by every rank, its own shard only. Either
  resumes at any stage and on any world size.
* bf16 weights over fp32 masters (``train.precision.weights=bf16``, ``masters=True``): the model
  holds bf16 weights and gradients; this rank's fp32 master copy of its shard lives here with the
  optimizer state (split with it at stages 1 and 2, whole at 0), the rule updates the masters and
  the step writes their bf16 rounding into the weights before the allgather (sent as 16-bit
  integers: Horovod 0.28.1's collectives refuse bfloat16). Gradients travel and accumulate in fp32
  at stage 2 (the buckets and the shard accumulator); at stages 0 and 1 Horovod reduces the bf16
  ``.grad`` on an fp32 wire (:class:`Fp32Wire`). Checkpoints hold the masters as the model's
  fp32 weights (:meth:`ShardedOptimizer.full_masters`), so a checkpoint is the same file at
  either precision and resumes at the other.
* Elastic commits keep a rank's shard and its ring neighbour's (:meth:`ShardedOptimizer.commit`):
  2/N of the state per rank; after the loss of one rank the survivors rebuild every shard of the
  new world from them (:meth:`ShardedOptimizer.recover`).
"""

from __future__ import annotations

import collections
from typing import Callable

import torch
import horovod.torch as hvd

from hvd_bert.core import zero as Z
from hvd_bert.pt.kernels import optim as fused_optim
from hvd_bert.pt.optim_parts import SUPPORTED, Norms, Part, piece_rule
from hvd_bert.pt.zero_state import ShardStates

__all__ = ["ShardedOptimizer", "Fp32Wire", "state_bytes", "update_loss_scale", "loss_scale", "SUPPORTED"]

IN_FLIGHT = 4  # buckets queued to Horovod at once (it fuses what is queued in one cycle)
MAX_BUCKETS = 1 << 16  # buckets of a step at most (train.zero.bucket_mb: a smaller one is refused)


class Fp32Wire(hvd.Compression.none):
    """Horovod's wire format for bf16 gradients: fp32 (Horovod 0.28.1 refuses bfloat16 tensors),
    cast back on arrival; other tensors as they are."""

    @staticmethod
    def compress(tensor):
        return (tensor.float(), tensor.dtype) if tensor.dtype == torch.bfloat16 else (tensor, None)

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


def _wire_view(t: torch.Tensor) -> torch.Tensor:
    """A bf16 tensor's bits as int16 for Horovod's collectives (the same 2 bytes; exact)."""
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


class ShardedOptimizer(ShardStates):
    """The optimizer state of this rank's shard, and the collectives of a ZeRO step.

    ``optimizer`` is the unsharded optimizer over the model's parameters: its parameter groups
    give the hyperparameters (the engine sets their ``lr``), and it holds state only in a
    resume, on rank 0, for as long as the shards take to go out."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, stage: int, compression: str = "none",
                 bucket_mb: float = 32.0, process_set=None, norm_set=None, norm_weights=None,
                 masters: bool = False):
        self.optimizer = optimizer
        self.stage = stage
        # masters: the parameters become bf16 at hold_masters(); the fp32 copy of this rank's shard
        # lives here. The gradients' reductions and the state are fp32 either way.
        self.masters, self.dtype, self.master = masters, torch.float32, None
        # the optimizer's own rule over this shard's pieces (hvd_bert.pt.optim_parts.piece_rule)
        self.rule = piece_rule(optimizer)
        self.buffers, self.has_step = tuple(self.rule.buffers), self.rule.has_step
        # process_set: the data-parallel ranks the state is split over (stage 0, under tensor
        # parallelism only: not split); norm_set and norm_weights: the ranks whose per-tensor sums
        # of squares make each whole tensor's, and what each rank's counts (a tensor held whole
        # by T ranks of a tensor-parallel group counts 1/T on each)
        self.process_set = process_set if process_set is not None else hvd.global_process_set
        self.norm_set = norm_set if norm_set is not None else self.process_set
        self.compression = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
        self.bucket_mb = bucket_mb
        self.params, self.group_of = [], []
        for gi, group in enumerate(optimizer.param_groups):
            self.params += list(group["params"])
            self.group_of += [gi] * len(group["params"])
        self.starts = [0]
        for p in self.params:
            self.starts.append(self.starts[-1] + p.numel())
        self.weights = list(norm_weights) if norm_weights is not None else [1.0] * len(self.params)
        buckets = self.starts[-1] / max(1.0, bucket_mb * (1 << 20) / 4)
        if stage and buckets > MAX_BUCKETS:  # (each a collective of every step)
            from hvd_bert.config import ConfigError

            least = self.starts[-1] * 4 / MAX_BUCKETS / (1 << 20)
            raise ConfigError(f"train.zero.bucket_mb={bucket_mb:g} cuts this model's {self.starts[-1]:,} "
                              f"parameters into {buckets:,.0f} buckets, each a collective of every step; "
                              f"give at least {least:.2g} (the default is 32)")
        self.step_count = 0
        self.grad_shard: torch.Tensor | None = None
        self.repartition()
        if stage == 2:
            self._setup_reduction(max(1, int(bucket_mb * (1 << 20)) // 4))

    def repartition(self) -> None:
        """Split the state over the process set's ranks as they are now (at start, and after
        Horovod elastic changed the world: :meth:`recover` then fills the new shards)."""
        self.roots = self.process_set.ranks or list(range(self.process_set.size()))
        self.rank, self.size = (self.process_set.rank(), self.process_set.size()) if self.stage else (0, 1)
        self.part = Z.partition([p.numel() for p in self.params], self.size)
        self.pieces = self.part.pieces(self.rank)
        self.bucket = max(1, int(self.bucket_mb * (1 << 20)) // 4 // self.size)  # columns of N x S
        like = self.params[0]
        self.state = {n: torch.zeros(self.part.shard, dtype=self.dtype, device=like.device)
                      for n in self.buffers}
        self.grad_shard = None

    # ------------------------------------------------------------------ bf16 weights, fp32 masters
    @torch.no_grad()
    def hold_masters(self, fp32: list[torch.Tensor]) -> None:
        """This rank's fp32 masters from the parameters' fp32 values (``fp32``, in the optimizer's
        order, the same on every rank), the parameters being bf16 already (``masters``)."""
        self.master = torch.zeros(self.part.shard, dtype=self.dtype, device=self.params[0].device)
        self._read(fp32, *self.part.bounds(self.rank), self.master)

    @torch.no_grad()
    def full_masters(self) -> list[torch.Tensor]:
        """The whole fp32 masters of every parameter, on every rank (an allgather of the shards:
        a collective), for a checkpoint: what the bf16 weights round."""
        whole = [torch.zeros(p.shape, dtype=self.dtype, device=p.device) for p in self.params]
        self._write(whole, *self.part.bounds(self.rank), self.master)
        if self.size > 1:
            self.allgather_params(whole)
        return whole

    @torch.no_grad()
    def load_masters(self, fp32: list[torch.Tensor]) -> None:
        """A checkpoint's fp32 weights (whole, on every rank) into the masters and, rounded, into
        the bf16 parameters."""
        self.hold_masters(fp32)
        for p, t in zip(self.params, fp32):
            p.copy_(t)

    def _publish(self) -> None:
        """The updated masters' bf16 rounding into this rank's pieces of the parameters."""
        for i, off, pos, n in self.pieces:
            self.params[i].detach().view(-1)[off:off + n].copy_(self.master[pos:pos + n])

    # ------------------------------------------------------------------ sizes
    def state_bytes(self) -> int:
        """The bytes of this rank's optimizer state (its shard of every buffer, and of the fp32
        masters where the weights are bf16)."""
        held = list(self.state.values()) + ([self.master] if self.master is not None else [])
        return sum(t.numel() * t.element_size() for t in held)

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

    # ------------------------------------------------------------------ gradients (stage 2)
    def _setup_reduction(self, bucket_elements: int) -> None:
        """Stage 2: contiguous buckets of the flat gradient, each reduced as soon as the backward
        pass has produced every gradient it covers (a hook per parameter), so the whole gradient
        never exists at once: a parameter's ``.grad`` is freed once its buckets are on the wire."""
        total = self.part.total
        self.buckets = [(lo, min(lo + bucket_elements, total)) for lo in range(0, total, bucket_elements)]
        self.bucket_params = [[i for i, *_ in self._spans(lo, hi)] for lo, hi in self.buckets]
        self.param_buckets = [[] for _ in self.params]
        for j, members in enumerate(self.bucket_params):
            for i in members:
                self.param_buckets[i].append(j)
        self._reset_pending()
        self.in_flight = collections.deque()
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(lambda _p, i=i: self._ready(i))

    def _reset_pending(self) -> None:
        self.pending = [len(m) for m in self.bucket_params]
        self.unsent = [len(b) for b in self.param_buckets]
        self.launched = [False] * len(self.buckets)

    def _ready(self, i: int) -> None:
        for j in self.param_buckets[i]:
            self.pending[j] -= 1
            if self.pending[j] == 0:
                self._launch(j)
        self._retire(wait=False)

    def _launch(self, j: int) -> None:
        lo, hi = self.buckets[j]
        buf = torch.empty(hi - lo, dtype=self.dtype, device=self.params[0].device)
        self._read([p.grad for p in self.params], lo, hi, buf)
        wire, ctx = self.compression.compress(buf)
        handle = hvd.allreduce_async_(wire, name=f"hvd_bert.zero.grad.{j}", op=hvd.Average,
                                      process_set=self.process_set)
        self.in_flight.append((j, wire, ctx, handle))
        self.launched[j] = True
        for i in self.bucket_params[j]:
            self.unsent[i] -= 1
            if self.unsent[i] == 0:
                self.params[i].grad = None  # (every bucket it touches is on the wire)

    def _retire(self, wait: bool) -> None:
        """Add this rank's part of each reduced bucket (in order; ``wait``: all of them) to the
        shard accumulator and let the bucket go."""
        if self.grad_shard is None:
            self.grad_shard = torch.zeros(self.part.shard, dtype=self.dtype,
                                          device=self.params[0].device)
        mine_lo, mine_hi = self.part.bounds(self.rank)
        while self.in_flight and (wait or hvd.poll(self.in_flight[0][3])):
            j, wire, ctx, handle = self.in_flight.popleft()
            reduced = self.compression.decompress(hvd.synchronize(handle), ctx)
            lo, hi = self.buckets[j]
            a, b = max(lo, mine_lo), min(hi, mine_hi)
            if a < b:
                part = reduced[a - lo:b - lo].to(self.grad_shard.dtype)
                self.grad_shard[a - mine_lo:b - mine_lo].add_(part)

    def finish_backward(self) -> None:
        """After a backward pass (stage 2): send the buckets still waiting (a parameter without
        a gradient counts as zeros), take this rank's part of every one, free ``.grad``."""
        for j in range(len(self.buckets)):
            if not self.launched[j]:
                self._launch(j)
        self._retire(wait=True)
        for p in self.params:
            p.grad = None
        self._reset_pending()

    # ------------------------------------------------------------------ parameters
    def _pieces(self):
        """``(tensor, its piece of this rank's parameter, of its reduced gradient, offset in the
        shard, length)``: views into the parameters, so that the step updates them in place, and
        into ``.grad`` (stage 1: Horovod's allreduce left it whole) or the gradient shard (2)."""
        for i, off, pos, n in self.pieces:
            w = self.params[i].detach().view(-1)[off:off + n] if self.master is None else \
                self.master[pos:pos + n]
            if self.grad_shard is None:
                yield i, w, self.params[i].grad.view(-1)[off:off + n], pos, n
            else:
                yield i, w, self.grad_shard[pos:pos + n], pos, n

    def allgather_params(self, targets: list[torch.Tensor] | None = None) -> None:
        """Every rank's updated piece of the parameters (or of ``targets``, tensors of their shapes)
        into every rank's (a collective)."""
        s = self.part.shard
        lo = self.rank * s
        targets = targets if targets is not None else [p.detach() for p in self.params]

        def submit(cols):
            a, b = cols
            mine = torch.empty(1, b - a, dtype=targets[0].dtype, device=targets[0].device)
            self._read(targets, lo + a, lo + b, mine[0])
            return hvd.allgather_async(_wire_view(mine), name=f"hvd_bert.zero.ag.{a}",
                                       process_set=self.process_set)

        def finish(cols, handle):
            a, b = cols
            full = hvd.synchronize(handle).view(targets[0].dtype)
            for r in range(self.size):
                start, stop = r * s + a, min(r * s + b, self.part.total)
                if start < stop and r != self.rank:
                    self._write(targets, start, stop, full[r, :stop - start])

        with torch.no_grad():
            self._pipelined(self._columns(), submit, finish)

    # ------------------------------------------------------------------ the step
    def _allreduce(self, value: torch.Tensor, name: str) -> torch.Tensor:
        """The sum of a tensor over the ranks (on its device: no host read)."""
        return hvd.allreduce(value, op=hvd.Sum, name=name, process_set=self.norm_set)

    def _complete(self, sq: torch.Tensor) -> torch.Tensor:
        """The whole tensors' sums of squares from this rank's pieces' (``Norms.complete``): each
        weighted by what this rank's copy counts (tensor parallelism), summed over the ranks."""
        weights = torch.tensor(self.weights, dtype=torch.float64, device=sq.device)
        return self._allreduce(sq * weights, "hvd_bert.zero.piece_norms")

    def _parts(self) -> list[Part]:
        """This rank's pieces, group by group, with the same pieces of the state's shards."""
        groups = self.optimizer.param_groups
        parts = [Part(g, [], [], [], {n: [] for n in self.buffers}, self.step_count) for g in groups]
        for i, wp, gp, pos, n in self._pieces():
            part = parts[self.group_of[i]]
            part.index.append(i)
            part.w.append(wp)
            part.g.append(gp)
            for name in self.buffers:
                part.state[name].append(self.state[name][pos:pos + n])
        return parts

    @torch.no_grad()
    def step(self, *, inv_scale=1.0, max_grad_norm: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One step on this rank's pieces of the parameters, tensor piece by piece (no
        shard-sized temporary), then the allgather. Stage 1: after Horovod's allreduce of the
        gradients (``.grad``); stage 2: on the reduce-scattered shard. ``inv_scale``: the loss
        scale's inverse (a number or a 0-d tensor). Decided on the device, with no host read:
        returns ``(gate, gradient norm)`` as 0-d tensors, the gate 1 where the step applied and 0
        where the norm was not finite on the ranks (then nothing changed on any rank:
        ``optim_parts.coef``). The step count assumes the step applied: :meth:`skipped` takes
        it back."""
        if self.stage == 2 and self.grad_shard is None:
            raise RuntimeError("ZeRO stage 2: step() with no gradients reduced")
        if self.stage < 2 and self.master is not None:  # this rank's part of the bf16 .grad, in fp32
            self.grad_shard = torch.zeros(self.part.shard, dtype=self.dtype, device=self.params[0].device)
            self._read([p.grad for p in self.params], *self.part.bounds(self.rank), self.grad_shard)
        gsq = torch.zeros((), dtype=torch.float64, device=self.params[0].device)
        for i, _, gp, _, _ in self._pieces():
            if torch.is_tensor(inv_scale) or inv_scale != 1.0:
                gp.mul_(inv_scale)
            gsq += sumsq(gp) * self.weights[i]
        gnorm = self._allreduce(gsq, "hvd_bert.zero.norms").sqrt()
        gate = torch.isfinite(gnorm).to(torch.float32)
        limit = self.rule.clip_limit()
        limit = limit if limit is not None else max_grad_norm
        clip = None if limit is None else torch.where(gnorm > limit, limit / gnorm, torch.ones_like(gnorm))
        self.step_count += 1
        # the optimizer's rule on this rank's pieces, the whole tensors' norms by an allreduce
        self.rule.update(self._parts(), Norms(len(self.params), self._complete), clip, gate)
        if self.master is not None:
            self._publish()
        self.grad_shard = None
        if self.size > 1:
            self.allgather_params()
        return gate, gnorm

    def skipped(self) -> None:
        """The last :meth:`step` did not apply (its gate was 0): its count taken back."""
        self.step_count -= 1

    def drop_gradients(self) -> None:
        """Forget every gradient and reduction in flight without waiting for it (after Horovod
        reported a lost rank, its handles never complete)."""
        if self.stage == 2:
            self.in_flight.clear()
            self._reset_pending()
        self.grad_shard = None
        for p in self.params:
            p.grad = None


def sumsq(x: torch.Tensor):
    """The sum of squares of ``x``, in double: a number from the C kernel on a CPU (no
    temporary, the data in host memory), else a 0-d tensor on its device (no host read)."""
    if x.numel() == 0:
        return 0.0
    if fused_optim.usable([x]):
        return fused_optim.sumsq([x])
    return torch.linalg.vector_norm(x, dtype=torch.float64) ** 2


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes of a plain optimizer's state buffers (its per-tensor step counters left out)."""
    return sum(t.numel() * t.element_size() for st in optimizer.state.values() for t in st.values()
               if isinstance(t, torch.Tensor) and t.dim() > 0)


def update_loss_scale(scaler: torch.amp.GradScaler, gate: torch.Tensor) -> None:
    """GradScaler's own update (back off on an overflow, grow after growth_interval clean
    steps) for a step whose overflow check was the all-ranks norm, not ``scaler.unscale_``:
    ``gate`` (a 0-d tensor) 0 on an overflow, on the device (no host read)."""
    found_inf = (1.0 - gate.float()).reshape(1).to(scaler._scale.device)
    torch._amp_update_scale_(scaler._scale, scaler._growth_tracker, found_inf, scaler.get_growth_factor(),
                             scaler.get_backoff_factor(), scaler.get_growth_interval())


def loss_scale(scaler: torch.amp.GradScaler) -> torch.Tensor | None:
    """The loss scale as a tensor on its device (no host read; None when scaling is off)."""
    return scaler._scale if scaler.is_enabled() else None
