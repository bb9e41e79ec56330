"""The update rules of :class:`hvd_bert.pt.zero.ShardedOptimizer` on a rank's shard: LAMB (and
NVLAMB), LARS, AdamW and SGD, piece by piece of the tensors the shard holds, as
:func:`hvd_bert.core.zero.sharded_step` computes them (the whole tensors' norms from the
shard's allreduce of partial sums)."""

from __future__ import annotations

import math

import torch

from hvd_bert.pt.kernels import optim as fused_optim

__all__ = ["UpdateRules", "sumsq"]


class UpdateRules:
    """``_<kind>(weight norms, gradient norms)``: one step of the optimizer of that kind on this
    rank's pieces (the ``ShardedOptimizer`` gives ``_pieces``, ``state``, ``step_count``,
    ``optimizer``, ``_group`` and ``_allreduce``)."""

    def _lamb(self, wn, gn) -> None:
        opt, t = self.optimizer, self.step_count
        g0 = opt.param_groups[0]
        beta1, beta2 = g0["betas"]
        c1, c2 = (1.0 - beta1 ** t, 1.0 - beta2 ** t) if g0["bias_correction"] else (1.0, 1.0)
        m, v = self.state["exp_avg"], self.state["exp_avg_sq"]

        def update(i, wp, pos, n):  # u = (m / c1) / (sqrt(v / c2) + eps) + wd w, one piece
            denom = v[pos:pos + n].sqrt().mul_(1.0 / math.sqrt(c2)).add_(g0["eps"])
            u = torch.div(m[pos:pos + n], denom).mul_(1.0 / c1)
            wd = self._group(i)["weight_decay"]
            return u.add_(wp, alpha=wd) if wd else u

        usq = [0.0] * len(self.params)
        for i, wp, gp, pos, n in self._pieces():
            m[pos:pos + n].lerp_(gp, 1.0 - beta1)
            v[pos:pos + n].mul_(beta2).addcmul_(gp, gp, value=1.0 - beta2)
            usq[i] = sumsq(update(i, wp, pos, n)) * self.weights[i]
        un = self._allreduce(usq, "hvd_bert.zero.update_norms").sqrt()
        for i, wp, _, pos, n in self._pieces():  # the update again: a piece at a time, as stage 0's kernel
            group = self._group(i)
            ratio = float(wn[i] / un[i]) if opt._adapt(group) and wn[i] > 0 and un[i] > 0 else 1.0
            wp.add_(update(i, wp, pos, n), alpha=-group["lr"] * ratio)

    def _lars(self, wn, gn) -> None:
        buf = self.state["momentum_buffer"]
        for i, wp, gp, pos, n in self._pieces():
            group = self._group(i)
            lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
            vp = buf[pos:pos + n]
            vp.mul_(mu)
            if group["adapt"]:
                trust = 1.0
                if wn[i] > 0 and gn[i] > 0:
                    denom = max(float(gn[i] + wd * wn[i] + group["eps"]), 1e-38)
                    trust = float(group["eta"] * wn[i] / denom)
                vp.add_(gp.add(wp, alpha=wd) if wd else gp, alpha=lr * trust)
            else:
                vp.add_(gp, alpha=lr)
            wp.sub_(vp)

    def _adamw(self, wn, gn) -> None:
        t = self.step_count
        m, v = self.state["exp_avg"], self.state["exp_avg_sq"]
        g0 = self.optimizer.param_groups[0]
        beta1, beta2 = g0["betas"]
        for i, wp, gp, pos, n in self._pieces():
            group = self._group(i)
            mp, vp = m[pos:pos + n], v[pos:pos + n]
            wp.mul_(1.0 - group["lr"] * group["weight_decay"])
            mp.lerp_(gp, 1.0 - beta1)
            vp.mul_(beta2).addcmul_(gp, gp, value=1.0 - beta2)
            denom = vp.sqrt().div_(math.sqrt(1.0 - beta2 ** t)).add_(g0["eps"])
            wp.addcdiv_(mp, denom, value=-group["lr"] / (1.0 - beta1 ** t))

    def _sgd(self, wn, gn) -> None:
        buf = self.state.get("momentum_buffer")
        for i, wp, d, pos, n in self._pieces():
            group = self._group(i)
            if group["weight_decay"]:
                d = d.add(wp, alpha=group["weight_decay"])
            if buf is not None and group["momentum"]:
                bp = buf[pos:pos + n]
                bp.mul_(group["momentum"]).add_(d)
                d = d.add(bp, alpha=group["momentum"]) if group["nesterov"] else bp
            wp.add_(d, alpha=-group["lr"])


def sumsq(x: torch.Tensor) -> float:
    """The sum of squares of ``x``, in double (the C kernel on a CPU: no temporary)."""
    if x.numel() == 0:
        return 0.0
    if fused_optim.usable([x]):
        return fused_optim.sumsq([x])
    return float(torch.linalg.vector_norm(x, dtype=torch.float64)) ** 2
