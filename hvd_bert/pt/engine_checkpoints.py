"""The PyTorch engine's checkpoints (the methods of ``Engine`` that save and resume): a
consolidated ``ckpt-<step>.pt`` written by rank 0 (``hvd_bert.pt.checkpoint``'s format) or a
sharded one written by every rank (``hvd_bert.pt.sharded``), and the resume from either under
any layout. With bf16 weights the model's state is the fp32 masters (``Engine.model_state``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import horovod.torch as hvd

from hvd_bert.train.engine import checkpoint_meta, resume_on_rank0, refuse_nonfinite, restore_rng
from hvd_bert.pt.checkpoint import (CKPT_SUFFIX, check_optimizer_state, load_checkpoint_file, nonfinite,
                                    rng_state, set_rng_state, state_digest, write_checkpoint)
from hvd_bert.pt import sharded
from hvd_bert.train import sharded_checkpoint as S, sharded_state as SS
from hvd_bert.train.sharded_writer import BackgroundSaves
from hvd_bert.pt import tensor_parallel as TP

__all__ = ["Checkpoints"]


class Checkpoints(BackgroundSaves):
    """Save and resume, for :class:`hvd_bert.pt.engine.Engine` (a base class of it)."""

    # ------------------------------------------------------------------ checkpoints
    def save(self, folder: str | Path, data_state: Any = None, keep: int = 3) -> Path | None:
        """Write ``folder/ckpt-<step>.pt`` atomically from rank 0 and keep the newest ``keep``
        (a collective: every rank must call it). The file holds tensors and plain types only
        (it loads with ``weights_only=True``); the metadata, every rank's RNG included, is
        ``train.engine.checkpoint_meta`` as JSON. Returns the path on rank 0."""
        rng = hvd.allgather_object(rng_state(), name="hvd_bert.rng")  # Horovod:
        if self.checkpoint_format == "sharded":  # every rank its share, written in the background
            return SS.save(sharded.declare(self), self.writer, folder, self.step_count,
                           checkpoint_meta(self, data_state, rng), keep, hvd.barrier)
        optimizer = (self.zero.consolidated_state_dict() if self.zero is not None
                     else self.optimizer.state_dict() if self.rank == 0 else None)
        model = self.model_state()
        if self.tp is not None and self.tp.dp_rank == 0:  # the first group makes every tensor whole
            model = TP.gather_state_dict(self.model, self.tp)
            optimizer = TP.gather_optimizer_state(optimizer, self.param_names(), self.tp)
        path = None
        if self.rank == 0:
            state = {"model": model, "optimizer": optimizer, "scaler": self.scaler.state_dict()}
            meta = {**checkpoint_meta(self, data_state, rng), "digest": state_digest(state)}
            path = write_checkpoint(folder, self.step_count, state, meta, keep)
        hvd.barrier()  # Horovod: the file exists before anyone goes on (e.g. to exit)
        return path

    def resume(self, folder_or_file: str | Path | None) -> Any:
        """Load the newest checkpoint in a folder (or a given file) on rank 0 and broadcast it.
        Returns the saved data state, or None when there is no checkpoint (a collective)."""
        loaded = {}

        def read_meta(path):
            if S.is_sharded(path):  # (every rank reads its share below)
                return S.Reader(path).meta
            loaded["ckpt"] = load_checkpoint_file(path, self.device)
            return json.loads(loaded["ckpt"]["meta"])

        def load(path):
            if "ckpt" not in loaded:
                return
            ckpt = loaded.pop("ckpt")
            check_optimizer_state(ckpt, path, None if self.tp else [p.shape for p in self._params()])
            if self.tp is not None:  # (whole tensors: every rank gets its share below)
                loaded["whole"] = ckpt
                return
            self.model.load_state_dict(ckpt["model"])
            loaded["model"] = ckpt["model"]  # (bf16 weights: the fp32 values go to every rank's masters)
            if self.zero is not None:  # (rank 0 holds it until the shards are sent)
                loaded["optimizer"] = ckpt["optimizer"]
            else:
                # the state from the file; the hyperparameters from this run's config (which the run
                # folder's config.json was checked against), never the file's param_groups
                self.optimizer.load_state_dict({"state": ckpt["optimizer"]["state"],
                                                "param_groups": self.optimizer.state_dict()["param_groups"]})
            loaded["scaler"] = ckpt["scaler"]

        meta = resume_on_rank0(self, folder_or_file, (CKPT_SUFFIX, S.SUFFIX), read_meta=read_meta,
                               load=load,
                               broadcast_object=lambda o, n: hvd.broadcast_object(o, root_rank=0, name=n),
                               allow_resized=self.resume_resized)
        if meta is None:
            return None
        if S.is_sharded(self.resumed_path):
            SS.load(sharded.declare(self, saving=False), self.resumed_path,  # every rank reads its own share
                    lambda obj, name: hvd.allgather_object(obj, name=name))  # Horovod:
        else:
            self._scatter_consolidated(loaded)
        restore_rng(self, meta, set_rng_state)
        refuse_nonfinite(self, self._nonfinite())
        return meta["data"]

    def _nonfinite(self) -> list[str]:
        """This rank's weights, optimizer state and loss scale that are not finite (a resume's check)."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        state = {**self.zero.state, "master": self.zero.master} if self.zero is not None else {
            f"{names.get(id(p), '?')}/{k}": v for p in self._params()
            for k, v in self.optimizer.state.get(p, {}).items()}
        return nonfinite({**self.model.state_dict(), **{f"optimizer {k}": v for k, v in state.items()}},
                         float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0)

    def _scatter_consolidated(self, loaded: dict) -> None:
        """What rank 0 read of a consolidated checkpoint, to every rank (a collective)."""
        if self.tp is not None:
            whole = loaded.pop("whole", None)
            self.zero.load_local(TP.scatter_from_rank0(whole, self.model, self.param_names(), self.tp))
            loaded["scaler"] = whole["scaler"] if whole is not None else None
        elif self.zero is not None and self.zero.master is not None:  # bf16 weights: fp32 on the wire
            state = loaded.pop("model", None) or {k: torch.zeros_like(v, dtype=torch.float32)
                                                   if v.dtype == torch.bfloat16 else torch.zeros_like(v)
                                                   for k, v in self.model.state_dict().items()}
            hvd.broadcast_parameters(state, root_rank=0)  # Horovod:
            self.load_model_state(state)
        else:
            self.broadcast()  # Horovod: parameters and optimizer state from rank 0
        if self.zero is not None and self.tp is None:
            self.zero.load_sharded(loaded.pop("optimizer", None))
        scaler = hvd.broadcast_object(loaded.get("scaler"), root_rank=0, name="hvd_bert.resume.scaler")
        self.scaler.load_state_dict(scaler)
