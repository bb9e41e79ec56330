"""BERT pretraining on Horovod, in either framework: the toolkit's main job.

    horovodrun -np 2 -H localhost:2 --gloo hvd-bert pretrain --framework pt \\
        --set data=DATA_DIR --set train.output_dir=runs/tiny

Reads top to bottom: the process (Horovod, threads), the data's sidecar checked against the
config, the model, the engine (optimizer, schedule, accumulation, mixed precision, broadcast),
then the shared loop (resume, logging, checkpoints, SIGTERM). Rank 0 prints the batch
arithmetic once and logs loss, MLM accuracy, LR and sequences/s. Phase 2 starts from a
phase-1 checkpoint's weights with a fresh optimizer and schedule (``init_checkpoint``), as
NVIDIA does.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hvd_bert.core.sharding import check_epochs, epoch_batches
from hvd_bert.config import ConfigError, PretrainConfig
from hvd_bert.config.bert import bert_preset
from hvd_bert.weights.published import checkpoint_config
from hvd_bert.data.pretraining import check_pretraining_data
from hvd_bert.data.vocab import init_vocab_error
from hvd_bert.evaluation.finetune import eval_batches
from hvd_bert.evaluation.pretraining import evaluate_pretraining
from hvd_bert.jobs.run_folder import finish_line, open_run, ranks_agree, with_run_folder
from hvd_bert.train.elastic import launch_mode
from hvd_bert.train.loop import fit
from hvd_bert.weights.portable import WeightsError

__all__ = ["run"]


def run(cfg: PretrainConfig, backend) -> dict:
    cfg = with_run_folder(cfg, "pretrain")
    rank, size = backend.init(cfg.train)
    # Plain, or Horovod elastic: then no collective before fit's state sync (a worker that joins
    # later would pair it with the others'), so each rank reads what rank 0 would have broadcast.
    launch = launch_mode()
    ranks_agree(cfg, backend, launch)  # the same settings and data everywhere, or one line on every rank
    out = Path(cfg.train.output_dir)
    meta = check_pretraining_data(cfg.data, cfg.max_seq_length, cfg.max_predictions_per_seq)
    eval_meta = None
    if cfg.eval_data:  # held-out data: the same lengths and the same vocabulary as the training data
        eval_meta = check_pretraining_data(cfg.eval_data, cfg.max_seq_length, cfg.max_predictions_per_seq,
                                           Path(cfg.data) / meta["vocab_file"])

    backend.set_precision(cfg.train.precision.mode)
    # phase 2: the model is what init_checkpoint's files say (heads, activation, LayerNorm epsilon),
    # read by every rank from its config alone (as fine-tuning does), else the preset
    init = checkpoint_config(cfg.init_checkpoint) if cfg.init_checkpoint else None
    bert = (replace(init, hidden_dropout=cfg.dropout, attention_dropout=cfg.dropout) if init is not None else
            bert_preset(cfg.model, vocab_size=meta["vocab_size"],
                        max_position_embeddings=max(512, cfg.max_seq_length),
                        hidden_dropout=cfg.dropout, attention_dropout=cfg.dropout))
    if bert.max_position_embeddings < cfg.max_seq_length:
        raise ConfigError(f"max_seq_length {cfg.max_seq_length} is longer than the "
                          f"{bert.max_position_embeddings} positions of init_checkpoint "
                          f"{cfg.init_checkpoint}: give --set max_seq_length={bert.max_position_embeddings} "
                          f"or less (and data prepared for it)")
    tp = cfg.train.tensor_parallel
    if bert.num_heads % tp or bert.intermediate_size % tp:  # (before anything is built or launched further)
        fits = [t for t in range(1, bert.num_heads + 1) if not bert.num_heads % t
                and not bert.intermediate_size % t and not size % t]
        raise ConfigError(f"train.tensor_parallel={tp} does not divide the model's {bert.num_heads} "
                          f"attention heads and its intermediate size {bert.intermediate_size}: each rank "
                          f"of a group holds whole heads; give train.tensor_parallel one of {fits}")
    # a local batch no rank's data can fill is the data's line, before the memory plan sizes it
    # (the batch as this world lays it out: an elastic run's global batch on its ranks)
    laid, replicas = launch.layout(cfg.train, size), max(1, size // tp)
    epoch_batches([s["file"] for s in meta["shards"]], [s["records"] for s in meta["shards"]], replicas,
                  laid.batch.plan(replicas).local_batch_size, 0, cfg.train.seed,
                  cfg.record_striding or len(meta["shards"]) < replicas)
    memory_plan = plan_memory(laid, bert, backend, size, cfg.max_seq_length, cfg.max_predictions_per_seq)
    backend.seed(cfg.train.seed + rank)  # per-rank dropout streams
    # PyTorch builds only this rank's share (train.tensor_parallel), the same weights on any layout
    model = backend.bert_pretraining(bert, cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.train)
    backend.activation_checkpointing(model, cfg.train.activation_checkpointing)
    if cfg.compile_layers:
        backend.compile_layers(model)  # (compiled at the first steps)
    error = None
    split = cfg.train.tensor_parallel > 1  # (then every rank loads its share of init_checkpoint)
    if cfg.init_checkpoint and (launch.reads_here(rank) or split):  # phase 2: weights only (broadcast)
        try:
            arrays, config = backend.read_checkpoint_weights(cfg.init_checkpoint)
            if config is not None:  # before the weights: a data/vocab mismatch is the data's fault
                error = init_vocab_error(cfg.init_checkpoint, config.vocab_size, cfg.data, meta,
                                         "prepare-bert")
            if error is None:
                backend.load_weights(model, arrays, source=f"init_checkpoint {cfg.init_checkpoint}")
        except WeightsError as e:
            error = str(e)
    error = launch.shared(backend.broadcast_object, error, "hvd_bert.pretrain.init")  # every rank stops on it
    if error:
        raise WeightsError(error)
    dense = backend.param_count(model)  # (the dense model's, also when this rank holds a share)
    train = launch.layout(cfg.train, size)  # (elastic: the global batch laid out on this world)
    engine = backend.engine(model, backend.pretraining_loss, train, sync=launch.syncs_at_start)
    # (a tensor-parallel group reads one batch: the data is split over the data-parallel replicas)
    striding = cfg.record_striding or len(meta["shards"]) < engine.data_size
    # an epoch has at least one batch on every rank (a ShardingError before the run folder is touched)
    micro_steps = cfg.train.schedule.total_steps * engine.plan.backward_passes_per_step
    check_epochs([s["file"] for s in meta["shards"]], [s["records"] for s in meta["shards"]],
                 engine.data_size, engine.plan.local_batch_size, micro_steps, cfg.train.seed, striding)

    total = cfg.train.schedule.total_steps
    log = open_run(cfg, backend, rank, total_steps=total, bert=bert, launch=launch,
                   line_keys=("loss", "mlm_accuracy", "lr", "sequences_per_s"))
    log.print(memory_plan)
    name = f"BERT from {cfg.init_checkpoint}" if init is not None else f"BERT-{cfg.model}"
    tp = cfg.train.tensor_parallel  # (built split: this rank holds its share)
    mine = backend.param_count(model, share=True)
    share = f", {mine / 1e6:.1f}M on each of its {tp} tensor-parallel ranks" if tp > 1 else ""
    log.print(f"model: {name} ({dense / 1e6:.1f}M parameters{share}, "
              f"{backend.label}), "
              f"data: {cfg.data} ({meta['total_records']} sequences of {cfg.max_seq_length}, "
              f"{len(meta['shards'])} shards)")

    def batches_from(micro_step):  # (an elastic run changes the engine's rank, size and plan)
        return backend.record_batches(cfg.data, "bert-pretraining", engine.data_rank, engine.data_size,
                                      engine.plan.local_batch_size,
                                      seed=cfg.train.seed, shuffle_buffer=cfg.shuffle_buffer,
                                      record_striding=(cfg.record_striding
                                                       or len(meta["shards"]) < engine.data_size),
                                      start=micro_step, pack=cfg.pack_sequences,
                                      segments=cfg.packed_attention == "varlen")

    score = backend.pretraining_scorer(model, cfg.train.precision.mode)

    def heldout(step: int) -> dict:
        """Every held-out sequence scored once across the ranks (a collective)."""
        batches = eval_batches(cfg.eval_data, eval_meta, engine.data_rank, engine.data_size,
                               cfg.eval_batch_size)
        tp = cfg.train.tensor_parallel  # (the T ranks of a group score the same sequences: counted once)
        res = evaluate_pretraining(score, batches,
                                   lambda sums: backend.allreduce_sum(sums, "hvd_bert.pretrain.eval") / tp)
        log.print(f"eval at step {step}: masked-LM accuracy {res['eval_mlm_accuracy']:.4f} (loss "
                  f"{res['eval_mlm_loss']:.4f}), next-sentence accuracy {res['eval_nsp_accuracy']:.4f} on "
                  f"{res['eval_examples']} held-out sequences")
        log.record({"step": step, **res}, prefix="eval", show=False)
        return res

    def on_step(result, _metrics=None) -> bool:
        if cfg.eval_data and cfg.eval_every and result.step % cfg.eval_every == 0 and result.step < total:
            heldout(result.step)
        return False

    elastic = launch.hook(backend, cfg.train, make_writer=lambda: backend.summary_writer(out / "tensorboard"))
    res = fit(engine, batches_from, total_steps=total, output_dir=out, log=log, unit="sequences",
              on_step=on_step, elastic=elastic)
    final = heldout(res.steps) if cfg.eval_data and not res.stopped_by_signal else {}
    log.close()
    finish_line(res, engine.rank, f"checkpoint: {res.checkpoint or 'unchanged'}", backend, out,
                evaluated=bool(final))
    return {"steps": res.steps, "stopped": res.stopped_by_signal,
            "last": res.history[-1] if res.history else {}, **final}


def plan_memory(train, bert, backend, world_size: int, seq: int, predictions: int) -> str:
    """The memory plan line (``core.model_size.memory_plan_line``) of this layout: the training
    state and the activations of a local batch at a step's peak (``core.activations``); a
    ConfigError naming the settings that would fit when the ranks sharing a host (or GPU) need
    more than it has available and ``train.check_memory`` is on."""
    from hvd_bert.config.train import activation_policy
    from hvd_bert.core.activations import ActivationShape, step_peak_bytes
    from hvd_bert.core.model_size import bert_parameters, memory_plan_line, rank_memory
    from hvd_bert.core.optim import state_buffers

    split, whole = bert_parameters(bert)
    available, sharing, where = backend.memory_available()
    local = train.batch.plan(max(1, world_size // train.tensor_parallel)).local_batch_size

    def need(t, b: int) -> tuple[str, bool]:
        tp = t.tensor_parallel
        m = rank_memory(split, whole, buffers=state_buffers(t.optim.name), zero_stage=t.zero.stage,
                        tensor_parallel=tp, data_parallel=max(1, world_size // tp),
                        masters=t.precision.weights == "bf16")
        x = ActivationShape(bert.hidden_size, bert.num_layers, bert.num_heads, bert.intermediate_size, seq, b,
                            predictions, bert.padded_vocab_size)
        act = step_peak_bytes(x, t.precision.mode, *activation_policy(t.activation_checkpointing), tp,
                              flash=where.startswith("GPU"))
        about = f" (local batch {b} x {seq}, activation_checkpointing {t.activation_checkpointing})"
        return memory_plan_line(m, sharing, available, where, act, about)

    line, fits = need(train, local)
    if not fits and train.check_memory:
        raise ConfigError(f"{line}: the run would run out of memory; {_what_fits(train, local, need)}, start "
                          f"fewer ranks per host, or --set train.check_memory=false to try anyway")
    return line


def _what_fits(train, local: int, need) -> str:
    """The settings, one change each, under which ``need`` says the run fits."""
    from dataclasses import replace as changed

    fits = []
    if train.activation_checkpointing == "off":
        recomputed = changed(train, activation_checkpointing="layers")
        if need(recomputed, local)[1]:
            fits.append("--set train.activation_checkpointing=layers")
    if train.zero.stage < 2 and need(changed(train, zero=changed(train.zero, stage=2)), local)[1]:
        fits.append("--set train.zero.stage=2")
    b = local
    while b > 1:  # (the largest local batch that fits, the global batch kept by more accumulation)
        b //= 2
        if need(train, b)[1]:
            k = (train.batch.backward_passes_per_step or 1) * local // b
            fits.append(f"--set train.batch.local_batch_size={b} --set "
                        f"train.batch.backward_passes_per_step={k} (the same global batch)")
            break
    return ("it fits with " + ", or with ".join(fits) if fits else
            "split the state with --set train.zero.stage=2 and/or train.tensor_parallel (each divides it) "
            "and recompute activations (train.activation_checkpointing=layers)")
