"""``hvd-bert simulate --calibrate``: time allreduces of several sizes here (or across hosts)
with real Horovod ranks (``cluster.allreduce_probe``) and fit the cost model's latency and
bandwidth to them."""

from __future__ import annotations

import sys
from dataclasses import replace

from hvd_bert.cluster import launch
from hvd_bert.cluster.doctor import parse_hosts
from hvd_bert.core import cost_model as S

__all__ = ["calibrate"]


def calibrate(net: S.Interconnect, *, hosts: str | None = None, np: int | None = None,
              nic: str | None = None, say=print) -> S.Interconnect | None:
    """``net`` as a flat network with the alpha and bandwidth measured by ``np`` ranks (2, or
    every slot of ``hosts``); None when the measurement failed (said on stderr). A bad
    ``hosts`` is a ValueError."""
    if hosts and np is None:  # every slot of the hosts
        try:
            np = sum(slots for _, slots in parse_hosts(hosts))
        except ValueError as e:
            raise ValueError(str(e).replace("--hosts", "--calibrate-hosts")) from None
    res = launch.run(["-m", "hvd_bert.cluster.allreduce_probe"], np=np or 2, timeout=600, hosts=hosts,
                     nic=nic)
    if not res.ok:
        print(res.explain(), file=sys.stderr)
        return None
    probe, alpha, bw = S.fit_probe(res.stdout)
    say(f"measured {probe['size']}-rank allreduce {f'across {hosts}' if hosts else 'on this machine'}:")
    fitted = S.Interconnect(alpha, bw)
    for sz, t in probe["points"]:
        model = S.allreduce_time(sz, probe["size"], fitted)
        say(f"  {sz / 1024:>8.0f} KiB  {t * 1e3:8.3f} ms  (model {model * 1e3:8.3f} ms)")
    say(f"fitted ring model: alpha {alpha * 1e6:.1f} us, bandwidth {bw / 1e9:.2f} GB/s per rank")
    return S.with_bandwidth(replace(net, gpus_per_node=1), alpha, bw)
