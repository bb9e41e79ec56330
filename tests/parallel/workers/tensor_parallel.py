"""One rank of tests/parallel/test_tensor_parallel.py.

    python tensor_parallel.py batch SCENARIOS.json OUT_DIR

SCENARIOS.json: ``{name: ["layers", T] or ["build", T] or ["train", T, ZERO_STAGE, OPTIM, STEPS, CKPT_DIR] or
["reshard", T, ZERO_STAGE, STEPS, CKPT_DIR, FORMAT, SAVE_AT, KILL_AT]}``, run in order in one
launch; ``OUT_DIR/rank<r>.json`` holds each one's result by name (``reshard``: see its docstring).

``layers``: a small BERT for pretraining, dense on every rank and split over tensor-parallel
groups of T ranks (``hvd_bert.pt.tensor_parallel``), both from the same weights, forward and
backward on the batch of this rank's data-parallel replica; writes both losses and, per
parameter, the largest difference between the dense gradient and the gathered one.

``train``: the engine (``Engine.from_config`` with ``train.tensor_parallel=T``) trains the same
small BERT to step STEPS (resuming from CKPT_DIR when it holds a checkpoint; each replica on
its own batches, 2 micro-batches a step), saves a checkpoint there and writes the whole weights.

``published``: a Hugging Face folder of a dense BERT's weights (rank 0 writes it) loaded into
each rank's share under T, the job's way (``read_checkpoint_weights``, ``load_weights``), with
``tracemalloc`` following numpy's allocations: the peak the read held, by slices, and the same
file read whole (``safetensors.numpy.load_file``) into the same shares.
"""

import copy
import json
import os
import sys

import horovod.torch as hvd
import torch

from hvd_bert.config.bert import BertConfig
from hvd_bert.pt import init_horovod
from hvd_bert.pt.models.bert import BertForPreTraining, pretraining_loss
from hvd_bert.pt.tensor_parallel import gather, gather_state_dict, make_groups, split_dim, split_layers

SHIFT = int(os.environ.get("HVD_BERT_TEST_SEED_SHIFT", "0"))


def batch(seed: int, c: BertConfig, b: int = 4, s: int = 16, p: int = 3) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[1, 11:] = 0  # padding: the attention bias takes part
    return {"input_ids": torch.randint(0, c.vocab_size, (b, s), generator=g),
            "segment_ids": torch.randint(0, 2, (b, s), generator=g), "input_mask": mask,
            "masked_lm_positions": torch.randint(0, 10, (b, p), generator=g),
            "masked_lm_ids": torch.randint(0, c.vocab_size, (b, p), generator=g),
            "masked_lm_weights": torch.ones(b, p),
            "next_sentence_labels": torch.randint(0, 2, (b,), generator=g)}


CONFIG = BertConfig(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                    max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0)


def train(tp: int, stage: int, optim: str, steps: int, ckpt: str, recompute: str = "off") -> dict:
    """(``recompute``: train.activation_checkpointing)"""
    from hvd_bert.config import TrainConfig, apply_overrides
    from hvd_bert.config.train import activation_policy
    from hvd_bert.pt.tensor_parallel import gather_state_dict as whole
    from hvd_bert.train.backend import get_backend

    cfg = apply_overrides(TrainConfig(), [
        f"optim.name={optim}", "optim.lr=0.02", "batch.local_batch_size=4",
        "batch.backward_passes_per_step=2", "schedule.name=constant", "schedule.total_steps=100",
        f"tensor_parallel={tp}", f"zero.stage={stage}", "checkpoint_format=consolidated"])  # (read back)
    backend = get_backend("pt")
    r, _ = backend.init(cfg)
    torch.manual_seed(SHIFT + 7 * r)  # different on every rank: the engine takes rank 0's
    model = BertForPreTraining(CONFIG)
    model.activation_checkpointing(*activation_policy(recompute))
    engine = backend.engine(model, pretraining_loss, cfg)
    engine.resume(ckpt)
    losses = []
    while engine.step_count < steps:
        data = batch(1000 + SHIFT + 100 * engine.data_rank + engine.micro_step, CONFIG)
        res = engine.train_micro_batch(data)
        if res is not None:
            losses.append(float(engine.average(float(engine.last_metrics["loss"]), "loss")))
    engine.save(ckpt)
    weights = whole(model, engine.tp) if engine.tp is not None else model.state_dict()
    hvd.barrier()
    return {"losses": losses, "step": engine.step_count, "memory": engine.memory(),
            "weights": {k: t.reshape(-1).tolist() for k, t in weights.items()}}


def build(tp: int) -> dict:
    """The model built on the meta device with only this rank's share materialised
    (``tensor_parallel.build``), gathered whole: its weights and each rank's share's size."""
    from hvd_bert.pt.tensor_parallel import build as build_share

    model = build_share(lambda: BertForPreTraining(CONFIG), seed=5, std=0.02, tp=tp, device="cpu")
    weights = gather_state_dict(model, model.tp_groups) if tp > 1 else model.state_dict()
    hvd.barrier()
    return {"share": sum(p.numel() for p in model.parameters()),
            "weights": {k: t.reshape(-1).tolist() for k, t in weights.items()}}


GLOBAL = 12  # the reshard scenarios' global batch: 12 / D rows on each of D = 1, 2, 3 or 4 replicas


def reshard(tp: int, stage: int, steps: int, ckpt: str, fmt: str, save_at: list, kill_at: int = 0) -> dict:
    """Train to ``steps`` under this layout (resuming from ``ckpt`` whatever layout wrote it),
    checkpointing at the steps ``save_at``; each step's global batch of 12 is the same whatever
    the layout (replica d of D takes its rows). ``kill_at``: SIGKILL every rank as soon as that
    step's (background) save has started."""
    import signal
    from hvd_bert.config import TrainConfig, apply_overrides
    from hvd_bert.pt.tensor_parallel import gather_state_dict as whole
    from hvd_bert.train.backend import get_backend

    cfg = apply_overrides(TrainConfig(), [
        "optim.name=lamb", "optim.lr=0.02", f"batch.local_batch_size={GLOBAL // (hvd.size() // tp)}",
        "batch.backward_passes_per_step=1",
        "schedule.name=constant", "schedule.total_steps=100", f"tensor_parallel={tp}", f"zero.stage={stage}",
        f"checkpoint_format={fmt}", "resume_resized=true"])
    backend = get_backend("pt")
    backend.init(cfg)
    torch.manual_seed(SHIFT)
    model = BertForPreTraining(CONFIG)
    engine = backend.engine(model, pretraining_loss, cfg)
    engine.resume(ckpt)
    resumed_at = engine.step_count
    rows = GLOBAL // engine.data_size
    while engine.step_count < steps:
        data = batch(5000 + SHIFT + engine.step_count, CONFIG, b=GLOBAL)
        mine = {k: v[engine.data_rank * rows:(engine.data_rank + 1) * rows] for k, v in data.items()}
        if engine.train_micro_batch(mine) is not None and engine.step_count in save_at:
            engine.save(ckpt)
            if engine.step_count == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
    engine.wait_for_save()
    weights = whole(model, engine.tp) if engine.tp is not None else model.state_dict()
    hvd.barrier()
    return {"resumed_at": resumed_at, "step": engine.step_count, "memory": engine.memory(),
            "weights": {k: t.reshape(-1).tolist() for k, t in weights.items()}}


def main():
    spec, out = sys.argv[2:]
    init_horovod(process_sets=True)  # (Horovod's dynamic process sets: the groups are added after init)
    results = {}
    with open(spec) as f:
        for name, (mode, *args) in json.load(f).items():
            run = {"layers": layers, "train": train, "reshard": reshard, "build": build,
                   "published": published}[mode]
            results[name] = run(*args)
    with open(os.path.join(out, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump({"rank": hvd.rank(), **results}, f)


def layers(tp: int) -> dict:
    groups = make_groups(tp)
    c = CONFIG
    torch.manual_seed(SHIFT)
    dense = BertForPreTraining(c)  # the same weights on every rank
    split = split_layers(copy.deepcopy(dense), groups)
    data = batch(100 + SHIFT + groups.dp_rank, c)
    losses = []
    for model in (dense, split):
        loss, _ = pretraining_loss(model, data)
        loss.backward()
        losses.append(float(loss.detach()))
    shapes = {n: list(p.shape) for n, p in split.named_parameters()}
    want = dict(dense.named_parameters())
    diffs = {}
    for name, p in split.named_parameters():
        whole = gather(name, p.grad, groups)
        diffs[name] = [float((whole - want[name].grad).abs().max()), float(want[name].grad.abs().max()),
                       split_dim(name)]
    same = all(torch.equal(t, dense.state_dict()[k]) for k, t in gather_state_dict(split, groups).items())
    hvd.barrier()  # (Horovod shuts down when a rank exits: the other group may still be gathering)
    return {"tp_rank": groups.rank, "dp_rank": groups.dp_rank, "losses": losses, "grad_diffs": diffs,
            "shapes": shapes, "gathered_equals_dense": same}


PUBLISHED = BertConfig(vocab_size=96, hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512,
                       max_position_embeddings=32)


def published(tp: int, folder: str) -> dict:
    import tracemalloc
    from pathlib import Path

    from safetensors.numpy import load_file

    from hvd_bert.pt.models.bert import export_weights, read_checkpoint_weights
    from hvd_bert.pt.tensor_parallel import build as build_share, load_whole
    from hvd_bert.weights.hf import hf_to_portable, write_hf_folder

    torch.manual_seed(11)
    dense = BertForPreTraining(PUBLISHED)
    if hvd.rank() == 0:
        write_hf_folder(folder, export_weights(dense), PUBLISHED)
    hvd.barrier()
    file_bytes = (Path(folder) / "model.safetensors").stat().st_size
    read_checkpoint_weights(folder)  # (once untraced: the modules it imports are not the read's)
    peaks = {}
    for how in ("slices", "whole"):
        model = build_share(lambda: BertForPreTraining(PUBLISHED), seed=5, std=0.02, tp=tp, device="cpu")
        tracemalloc.start()
        if how == "slices":  # the job's way
            arrays, _ = read_checkpoint_weights(folder)
        else:
            arrays = hf_to_portable(load_file(str(Path(folder) / "model.safetensors")), PUBLISHED, folder)
        load_whole(model, arrays, model.tp_groups, folder)
        del arrays
        peaks[how] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        same = all(torch.equal(t, dense.state_dict()[k])
                   for k, t in gather_state_dict(model, model.tp_groups).items())
        peaks[f"{how}_equals_dense"] = same
    hvd.barrier()
    return {"file_bytes": file_bytes, **peaks}


if __name__ == "__main__":
    main()
