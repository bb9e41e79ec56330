"""The ``hvd-bert`` command (also ``python -m hvd_bert``).

    hvd-bert doctor                 check the installation with real 2-process runs
    hvd-bert config [--explain]     print the resolved configuration or its documentation
    hvd-bert prepare-bert           text -> BERT pretraining shards (mpirun: across ranks)
    hvd-bert prepare-classification TSV/CSV -> sentence(-pair) classification shards
    hvd-bert prepare-ncf            MovieLens or synthetic data -> NCF leave-one-out data
    hvd-bert pretrain               BERT pretraining (under horovodrun / mpirun)
    hvd-bert finetune               BERT fine-tuning: classification, STS-B, SQuAD (horovodrun / mpirun)
    hvd-bert ncf                    NCF (NeuMF) recommendation, HR@10 / NDCG@10 (horovodrun / mpirun)
    hvd-bert convert                a PyTorch or TensorFlow checkpoint -> portable .npz weights
    hvd-bert simulate               scaling projection (alpha-beta allreduce cost model)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="YAML", help="a YAML recipe (missing keys take defaults)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one setting, e.g. --set optim.lr=1e-3 (repeatable)")


def _cmd_doctor(args: argparse.Namespace) -> int:
    from hvd_bert.cluster.doctor import parse_hosts, run_doctor, run_host_checks

    if args.hosts:
        try:
            parse_hosts(args.hosts)
        except ValueError as e:
            print(f"hvd-bert doctor: {e}", file=sys.stderr)
            return 2
        return run_host_checks(args.hosts, timeout=args.timeout, ssh_port=args.ssh_port)
    return run_doctor(np=args.np, timeout=args.timeout, runs=not args.no_runs)


def _cmd_config(args: argparse.Namespace) -> int:
    import yaml

    from hvd_bert import config as C

    cls = _config_class(args.job)
    if args.explain:
        print("\n".join(C.explain(cls)))
        return 0
    cfg = C.load_config(cls, args.config, args.overrides)  # a ConfigError: main's one-line exit 2
    print(yaml.safe_dump(C.to_dict(cfg), sort_keys=False), end="")
    return 0


def default_cache():
    import os
    from pathlib import Path
    return Path(os.environ.get("HVD_BERT_CACHE", Path.home() / ".cache" / "hvd_bert"))


def default_corpus(vocab_size: int = 8192, lower: bool = True, build: bool = True, vocab=None):
    """The built-in corpus and its WordPiece vocab, made once and cached (a trained vocab is not
    bit-reproducible: the trainer breaks frequency ties in hash order)."""
    from hvd_bert.data.vocab import train_vocab
    from hvd_bert.train.checkpoint import atomic_write
    from hvd_bert.data.corpus import write_stdlib_corpus

    folder = default_cache() / "corpus"
    corpus = folder / f"stdlib-py{sys.version_info[0]}.{sys.version_info[1]}.txt"
    if vocab is None:
        vocab = folder / f"vocab-{vocab_size}-{'uncased' if lower else 'cased'}.txt"
        if build and not vocab.is_file():
            write_stdlib_corpus(corpus)
            import tempfile
            with tempfile.TemporaryDirectory() as tmp:
                made = train_vocab([corpus], tmp, vocab_size, lower)
                atomic_write(vocab, lambda t: t.write_bytes(made.read_bytes()))
    if build:
        write_stdlib_corpus(corpus)
    return corpus, vocab


def _mpi_world():
    """(rank, size, comm) under mpirun/srun --mpi=pmix, else (0, 1, None)."""
    import os
    if not any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")):
        return 0, 1, None
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    return comm.Get_rank(), comm.Get_size(), comm


def _vocab_and_case(args: argparse.Namespace):
    """``(vocab.txt or None, do_lower_case)``: ``--vocab`` resolved (a vocab.txt, a tokenizer.json
    or a checkpoint folder), and the case from ``--cased``/``--uncased``, else the checkpoint's,
    else lower-case."""
    from hvd_bert.data.vocab import resolve_vocab

    vocab = resolve_vocab(args.vocab) if args.vocab else None
    if args.cased or args.uncased:
        lower = not args.cased
    elif vocab is not None and vocab.do_lower_case is not None:
        lower = vocab.do_lower_case
        print(f"{'lower-casing' if lower else 'keeping case'}, as the checkpoint of {vocab.source} does "
              f"(--cased / --uncased to change)")
    else:
        lower = True
    return (vocab.path if vocab else None), lower


def _like_phase_one(args: argparse.Namespace, rank: int) -> None:
    """``--like``: the text, vocabulary and case of phase-1 data (or of a run folder's data),
    for what the command line does not give itself."""
    from hvd_bert.data.pretraining import phase_one_data

    folder, meta = phase_one_data(args.like)
    if not args.input:  # phase 1's files, read as phase 1 read them
        args.input = meta["input_paths"]
        formats = set(meta.get("input_formats", []))
        if args.input_format == "auto" and len(formats) == 1:
            args.input_format = formats.pop()
    args.sentence_splitter = args.sentence_splitter or meta.get("sentence_splitter")
    args.vocab = args.vocab or str(folder / meta.get("vocab_file", "vocab.txt"))
    if not (args.cased or args.uncased):
        args.uncased, args.cased = bool(meta["do_lower_case"]), not meta["do_lower_case"]
    if rank == 0:
        more = len(args.input) - 3
        shown = ", ".join(args.input[:3]) + (f" and {more} more" if more > 0 else "")
        print(f"as {folder}: text {shown}; vocab {args.vocab}; "
              f"{'lower-cased' if args.uncased else 'cased'} (--input, --vocab, --cased/--uncased to change)")


def _cmd_prepare_bert(args: argparse.Namespace) -> int:
    from hvd_bert.data.masking import PretrainingSettings
    from hvd_bert.data.pretraining import prepare_bert
    from hvd_bert.data.records import DatasetError

    rank, size, comm = _mpi_world()
    try:
        if args.like:
            _like_phase_one(args, rank)
        vocab, lower = _vocab_and_case(args)
    except DatasetError as e:
        print(f"hvd-bert prepare-bert: {e}", file=sys.stderr)
        return 2
    inputs = args.input
    if not inputs:
        corpus, vocab = default_corpus(args.vocab_size, lower, rank == 0, vocab)
        if comm is not None:
            comm.Barrier()
        inputs = [str(corpus)]
        if rank == 0:
            print(f"no --input: using the built-in corpus {corpus} (Python standard library docstrings)")
    try:
        settings = PretrainingSettings(
            max_seq_length=args.max_seq_length, max_predictions_per_seq=args.max_predictions_per_seq,
            masked_lm_prob=args.masked_lm_prob, short_seq_prob=args.short_seq_prob,
            dupe_factor=args.dupe_factor, do_lower_case=lower, seed=args.seed)
        meta = prepare_bert(inputs, args.output, vocab_file=vocab, vocab_size=args.vocab_size,
                            num_shards=args.num_shards, settings=settings, rank=rank, world_size=size,
                            comm=comm, overwrite=args.overwrite, input_format=args.input_format,
                            progress=args.progress, unit_bytes=max(1, int(args.split_mb * 2**20)),
                            sentence_splitter=args.sentence_splitter or "syntok")
    except (DatasetError, ValueError) as e:  # raised on every rank (prepare_bert agrees on errors)
        print(f"hvd-bert prepare-bert: {e}", file=sys.stderr)
        return 2
    if meta is not None:
        print(f"wrote {meta['total_records']} instances in {meta['num_shards']} shards to {args.output} "
              f"(vocab {meta['vocab_size']} tokens, seq {meta['max_seq_length']}, {size} process(es))")
        if vocab is None:  # tokenizers' trainer breaks frequency ties in hash order (tokenizers#1794)
            print(f"the vocab was trained here and training is not bit-reproducible; to make the same "
                  f"shards again, pass --vocab {Path(args.output) / 'vocab.txt'}")
    return 0


def _cmd_prepare_classification(args: argparse.Namespace) -> int:
    from hvd_bert.data.classification import prepare_classification
    from hvd_bert.data.records import DatasetError

    try:
        vocab, lower = _vocab_and_case(args)
        meta = prepare_classification(args.table, args.output, vocab, text_a=args.text_a,
                                      text_b=args.text_b, label=args.label,
                                      max_seq_length=args.max_seq_length, num_shards=args.num_shards,
                                      do_lower_case=lower, labels=args.labels,
                                      overwrite=args.overwrite, task=args.task, regression=args.regression)
    except (DatasetError, ValueError) as e:
        print(f"hvd-bert prepare-classification: {e}", file=sys.stderr)
        return 2
    what = "a numeric label (regression)" if meta["regression"] else f"{len(meta['labels'])} labels"
    print(f"wrote {meta['total_records']} examples ({what}) to {args.output}")
    return 0


def _cmd_prepare_squad(args: argparse.Namespace) -> int:
    from hvd_bert.data.records import DatasetError
    from hvd_bert.data.squad import prepare_squad

    rank, size, comm = _mpi_world()
    try:
        vocab, lower = _vocab_and_case(args)
        meta = prepare_squad(args.input, args.output, vocab, do_lower_case=lower,
                             version_2=args.version_2_with_negative, is_training=args.split == "train",
                             max_seq_length=args.max_seq_length, doc_stride=args.doc_stride,
                             max_query_length=args.max_query_length, num_shards=args.num_shards, rank=rank,
                             world_size=size, comm=comm, overwrite=args.overwrite)
    except DatasetError as e:  # raised on every rank (prepare_squad agrees on errors)
        print(f"hvd-bert prepare-squad: {e}", file=sys.stderr)
        return 2
    if meta is not None:
        print(f"wrote {meta['total_records']} features of {meta['examples']} questions "
              f"({meta['skipped_examples']} skipped: answer not in the context's words) in "
              f"{meta['num_shards']} shards to {args.output} ({size} process(es))")
    return 0


def _cmd_prepare_ncf(args: argparse.Namespace) -> int:
    from hvd_bert.data.ncf import prepare_ncf
    from hvd_bert.data.records import DatasetError

    try:
        meta = prepare_ncf(args.output, movielens=args.movielens,
                           synthetic=None if args.movielens else args.synthetic,
                           synthetic_scale=args.scale, seed=args.seed, overwrite=args.overwrite,
                           eval_negatives=args.eval_negatives, skip_bad_lines=args.skip_bad_lines,
                           report=lambda m: print(f"warning: {m}", file=sys.stderr))
    except (DatasetError, ValueError) as e:
        print(f"hvd-bert prepare-ncf: {e}", file=sys.stderr)
        return 2
    print(f"{meta['source']}: {meta['n_users']} users, {meta['n_items']} items, "
          f"{meta['train_interactions']} training interactions, leave-one-out test with "
          f"{meta['test_negatives']} negatives per user -> {args.output}")
    return 0


def default_data(max_seq_length: int = 128):
    return default_cache() / "data" / f"stdlib-seq{max_seq_length}"


def default_ncf_data() -> Path:
    """The synthetic ml-1m data under the cache, prepared by the first process that needs it
    (a file lock keeps concurrent ranks from preparing it twice)."""
    import fcntl

    from hvd_bert.data.ncf import prepare_ncf

    folder = default_cache() / "data" / "ncf-synthetic-ml-1m"
    if not (folder / "dataset.json").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / ".ncf-synthetic-ml-1m.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (folder / "dataset.json").is_file():
                prepare_ncf(folder, synthetic="ml-1m", seed=0, overwrite=True)
    return folder


def _pretrain_defaults(cfg):
    return cfg if cfg.data else replace(cfg, data=str(default_data(cfg.max_seq_length)))


def _ncf_defaults(cfg):
    return cfg if cfg.data else replace(cfg, data=str(default_ncf_data()))


def _pretrain_data_hint(cfg) -> str:
    if (Path(cfg.data).expanduser() / "dataset.json").is_file():  # prepared: the error says the rest
        return ""
    return (f"\n  to prepare the built-in corpus: hvd-bert prepare-bert --output {cfg.data} "
            f"--max-seq-length {cfg.max_seq_length}")


def _config_class(job: str):
    from hvd_bert import config as C
    from hvd_bert.evaluation.ncf import NCFConfig

    return {"train": C.TrainConfig, "pretrain": C.PretrainConfig, "finetune": C.FinetuneConfig,
            "ncf": NCFConfig}[job]


# The training jobs: name -> (help, module of run(cfg, backend), fill-in of defaults, hint for
# a data error). Each job is one file in hvd_bert/jobs/, the same for both frameworks.
JOBS = {
    "pretrain": ("BERT pretraining, one process per rank: start it with horovodrun -np N or mpirun -np N",
                 "hvd_bert.jobs.pretrain", _pretrain_defaults, _pretrain_data_hint),
    "finetune": ("BERT fine-tuning from a pretrained checkpoint: classification, regression (STS-B) or "
                 "SQuAD, one process per rank (horovodrun / mpirun)", "hvd_bert.jobs.finetune", None, None),
    "ncf": ("NCF (NeuMF) recommendation with HR@10 / NDCG@10, one process per rank (horovodrun / "
            "mpirun)", "hvd_bert.jobs.ncf", _ncf_defaults, None),
}


EXIT_STOPPED = 3  # a job stopped by a signal after saving its checkpoint: rerun it to resume


def user_errors() -> tuple[type, ...]:
    """The errors that are the user's to fix (bad settings, data, checkpoints, a diverged run):
    one line and exit status 2, never a traceback."""
    from hvd_bert.weights.portable import WeightsError
    from hvd_bert.train.checkpoint import RunFolderBusy
    from hvd_bert.config import ConfigError
    from hvd_bert.train.engine import CheckpointError, ResumeError
    from hvd_bert.data.records import DatasetError
    from hvd_bert.train.log import DivergedError

    return (ConfigError, DatasetError, WeightsError, CheckpointError, ResumeError, DivergedError,
            RunFolderBusy)


def _cmd_job(args: argparse.Namespace) -> int:
    """Every training job: the config (recipe, --set, --framework), the backend, ``run``; a
    user error is one clear line on every rank and exit status 2 (``main``)."""
    import importlib

    from hvd_bert.train.backend import get_backend
    from hvd_bert.config import load_config

    from hvd_bert.data.records import DatasetError

    _, module, defaults, hint = JOBS[args.command]
    overrides = list(args.overrides) + ([f"framework={args.framework}"] if args.framework else [])
    overrides += [f"task={args.task}"] if getattr(args, "task", None) else []
    cfg = load_config(_config_class(args.command), args.config, overrides)
    if defaults is not None:
        cfg = defaults(cfg)
    if hint is not None:
        args.error_hint = lambda e: hint(cfg) if isinstance(e, DatasetError) else ""
    result = importlib.import_module(module).run(cfg, get_backend(cfg.framework))
    # Stopped by SIGTERM/SIGINT before the end (a checkpoint was saved): not a success, so that a
    # SLURM dependency (afterok) waits for the run to finish; the job scripts requeue on it.
    return EXIT_STOPPED if result.get("stopped") else 0


def _vocab_of(src: Path) -> Path | None:
    """The vocab.txt that goes with a checkpoint: a Hugging Face folder's own, or the one of the
    data a run folder trained on (its config.json names the data)."""
    import json

    folder = src if src.is_dir() else src.parent
    if (folder / "vocab.txt").is_file():
        return folder / "vocab.txt"
    cfg = folder / "config.json"
    try:
        data = json.loads(cfg.read_text()).get("data") if cfg.is_file() else None
    except (OSError, ValueError):
        data = None
    if data and (Path(data).expanduser() / "vocab.txt").is_file():
        return Path(data).expanduser() / "vocab.txt"
    return None


def _cmd_evaluate_squad(args: argparse.Namespace) -> int:
    """The official SQuAD v1.1 / v2.0 evaluation of a predictions file, printed as the official
    scripts print it (the version comes from the data file)."""
    import json

    from hvd_bert.evaluation.squad import evaluate_files, format_result

    result = evaluate_files(args.data_file, args.pred_file, args.na_prob)
    version = json.loads(Path(args.data_file).read_text(encoding="utf-8")).get("version")
    print(format_result(version, result))
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    """A checkpoint of either framework, a portable .npz or a Hugging Face folder -> portable
    weights (.npz) or a Hugging Face folder (``--to hf``)."""
    from hvd_bert.weights.portable import WeightsError, save_weights
    from hvd_bert.train.checkpoint import latest_checkpoint
    from hvd_bert.weights.hf import is_hf_folder, write_hf_folder

    src = Path(args.checkpoint).expanduser()
    if not src.exists():
        raise WeightsError(f"{src} does not exist; give a run folder, a ckpt-*.pt / ckpt-*.tf, a .npz or a "
                           f"Hugging Face model folder")
    framework = args.framework
    if framework == "auto":  # PyTorch's reader also reads .npz and Hugging Face folders
        tf_only = src.is_dir() and not is_hf_folder(src) and latest_checkpoint(src, "tf") and \
            not latest_checkpoint(src, "pt")
        framework = "tf" if src.suffix == ".tf" or tf_only else "pt"
    kind = {".pt": "pt", ".tf": "tf"}.get(src.suffix)
    if kind and kind != framework:
        raise WeightsError(f"{src} is a {'PyTorch' if kind == 'pt' else 'TensorFlow'} checkpoint; use "
                           f"--framework {kind} (or leave it out)")
    if framework == "pt":
        from hvd_bert.pt.models.bert import read_checkpoint_weights
    else:
        from hvd_bert.tf.models.bert import read_checkpoint_weights
    arrays, config = read_checkpoint_weights(src)
    if config is None:
        raise WeightsError(f"no bert_config.json beside {src}: it is written into every run folder by "
                           f"hvd-bert pretrain / finetune")
    n = f"{len(arrays)} tensors, {sum(a.size for a in arrays.values()) / 1e6:.1f}M parameters"
    if args.to == "google":
        from hvd_bert.tf.google_ckpt import write_google

        vocab = Path(args.vocab) if args.vocab else _vocab_of(src)
        out = write_google(args.output, arrays, config, vocab_file=vocab)
        print(f"{src} ({n}) -> {out} (Google TF1: bert_config.json + bert_model.ckpt, as modeling.py reads)")
        return 0
    if args.to == "hf":
        vocab = Path(args.vocab) if args.vocab else _vocab_of(src)
        out = write_hf_folder(args.output, arrays, config, vocab_file=vocab, do_lower_case=not args.cased)
        print(f"{src} ({n}) -> {out} (Hugging Face: transformers.BertForPreTraining.from_pretrained"
              f"({str(out)!r})){'' if vocab else '; no vocab.txt found: copy one in, or pass --vocab'}")
        return 0
    out = save_weights(args.output, arrays, config)
    print(f"{src} ({framework}, {n}) -> {out}; load it with --set init_checkpoint={out} in either framework")
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from hvd_bert.core import cost_model as S

    net = S.INTERCONNECTS[args.interconnect]
    if args.calibrate:
        from hvd_bert.cluster import launch
        from hvd_bert.cluster.doctor import parse_hosts
        np_ = args.calibrate_np
        if args.calibrate_hosts and np_ is None:  # every slot of the hosts
            try:
                np_ = sum(slots for _, slots in parse_hosts(args.calibrate_hosts))
            except ValueError as e:
                print(f"hvd-bert simulate: {str(e).replace('--hosts', '--calibrate-hosts')}", file=sys.stderr)
                return 2
        res = launch.run(["-m", "hvd_bert.cluster.allreduce_probe"], np=np_ or 2, timeout=600,
                         hosts=args.calibrate_hosts, nic=args.calibrate_nic)
        if not res.ok:
            print(res.explain(), file=sys.stderr)
            return 1
        probe, alpha, bw = S.fit_probe(res.stdout)
        where = f"across {args.calibrate_hosts}" if args.calibrate_hosts else "on this machine"
        print(f"measured {probe['size']}-rank allreduce {where}:")
        fitted = S.Interconnect(alpha, bw)
        for sz, t in probe["points"]:
            model = S.allreduce_time(sz, probe["size"], fitted)
            print(f"  {sz / 1024:>8.0f} KiB  {t * 1e3:8.3f} ms  (model {model * 1e3:8.3f} ms)")
        print(f"fitted ring model: alpha {alpha * 1e6:.1f} us, bandwidth {bw / 1e9:.2f} GB/s per rank")
        net = S.with_bandwidth(replace(net, gpus_per_node=1), alpha, bw)
    if args.params is not None:
        w = S.Workload("custom", args.params, args.tensors, args.micro_batch_seconds, args.samples)
    else:
        w = S.WORKLOADS[args.workload]
    kw = dict(algorithm=args.algorithm,
              fusion_bytes=None if args.fusion_mb == 0 else args.fusion_mb * S.MIB, fp16=args.fp16,
              overlap=not args.no_overlap, backward_passes_per_step=args.k)
    print(f"workload: {w.name} ({w.params / 1e6:.1f}M parameters, {w.micro_batch_seconds * 1e3:.1f} ms "
          f"per micro-batch{'; ' + w.note if w.note else ''})")
    print(f"network: {net.note}; {args.algorithm} allreduce, "
          f"{'fp16' if args.fp16 else 'fp32'} gradients, fusion {args.fusion_mb} MiB, "
          f"{'overlapped with backward' if not args.no_overlap else 'no overlap'}, k={args.k}")
    print(f"{'GPUs':>6} {'step ms':>9} {'comm ms':>9} {'exposed ms':>10} {'efficiency':>10} "
          f"{'samples/s':>12}")
    for n in args.gpus:
        p = S.project(w, n, net, **kw)
        print(f"{n:>6} {p.step_s * 1e3:>9.1f} {p.comm_s * 1e3:>9.1f} {p.exposed_comm_s * 1e3:>10.1f} "
              f"{p.efficiency:>10.1%} {p.samples_per_s:>12,.0f}")
    if args.bert_recipe:
        total = 0.0
        n = args.gpus[-1]
        for name, steps, gbatch, seq in (("phase 1", 7038, 65536, 128), ("phase 2", 1563, 32768, 512)):
            per_gpu = gbatch / n
            base = S.WORKLOADS["bert-large-p1"]
            tflops = 6 * base.params * 128 * 64 / base.micro_batch_seconds / 1e12
            wl = replace(base, micro_batch_seconds=6 * base.params * seq * per_gpu / (tflops * 1e12),
                         samples_per_micro_batch=round(per_gpu))
            p = S.project(wl, n, net, **kw)
            total += steps * p.step_s
            print(f"{name}: {steps} steps of {gbatch} x {seq} ({per_gpu:.1f} seq/GPU): "
                  f"{p.step_s * 1e3:.0f} ms/step, efficiency {p.efficiency:.1%}, "
                  f"{steps * p.step_s / 60:.1f} min")
        print(f"BERT-Large (NVIDIA LAMB recipe) on {n} GPUs: {total / 60:.1f} minutes")
    return 0


def _add_case_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cased", action="store_true",
                   help="keep case (default: the checkpoint's, from --vocab, else lower-case)")
    p.add_argument("--uncased", action="store_true", help="lower-case (overrides the checkpoint's)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hvd-bert", description="Distributed large-batch training on Horovod "
                                     "(TensorFlow/Keras and PyTorch).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("doctor", help="check the installation with real 2-process Horovod runs")
    p.add_argument("--np", type=int, default=2, help="processes per check (default 2)")
    p.add_argument("--timeout", type=float, default=180, help="seconds per distributed check")
    p.add_argument("--no-runs", action="store_true", help="only report versions and the build")
    p.add_argument("--hosts", metavar="H1:SLOTS,H2:SLOTS",
                   help="check these hosts for a multi-node run instead: passwordless ssh, the same "
                        "environment path, a shared folder, the network interface, a cross-host allreduce")
    p.add_argument("--ssh-port", type=int, help="ssh port of the hosts (default: ssh's)")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("config", help="print the resolved training configuration (YAML)")
    _add_config_args(p)
    p.add_argument("--explain", action="store_true", help="document every setting instead")
    p.add_argument("--job", choices=["train", "pretrain", "finetune", "ncf"], default="train",
                   help="whose settings: a job's, or the engine's alone (train)")
    p.set_defaults(func=_cmd_config)

    p = sub.add_parser("prepare-bert", help="text files -> BERT pretraining TFRecord shards "
                                            "(under mpirun -np P: shards split across ranks)")
    p.add_argument("--input", nargs="*", default=[], metavar="PATH",
                   help="files, folders or globs, any mix, compressed (.gz, .bz2, .xz) or not: "
                        "Wikipedia pages-articles XML dumps, Google's format (a sentence per line, a "
                        "blank line between documents), one document per line, or prose (one "
                        "document per file); each told apart by its content (default: the built-in "
                        "Python-docstring corpus)")
    p.add_argument("--input-format", choices=["auto", "wiki", "google", "doc-per-line", "prose"],
                   default="auto", help="the inputs' format (default auto: each file's own, by content)")
    p.add_argument("--sentence-splitter", choices=["syntok", "blingfire"], default=None,
                   help="splits prose, one-document-per-line text and Wikipedia articles into sentences: "
                        "syntok (default; with --like, phase 1's), or blingfire (about 27x faster, but it "
                        "ends a sentence after a title such as 'Dr.' in running text)")
    p.add_argument("--split-mb", type=float, default=64,
                   help="read an uncompressed file larger than this (MiB) in byte ranges of this size, "
                        "cut at document starts and dealt to the ranks (default 64)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="a progress bar on rank 0 when its stderr is a terminal (default on)")
    p.add_argument("--output", required=True, help="output folder")
    p.add_argument("--vocab", help="the WordPiece vocabulary: a vocab.txt, a tokenizer.json, or a "
                                   "checkpoint folder (Hugging Face, Google) holding one (default: train "
                                   "one on the input)")
    p.add_argument("--vocab-size", type=int, default=8192, help="size of a trained vocab")
    p.add_argument("--like", metavar="DATA_OR_RUN",
                   help="phase 2: the text, vocab and case of this phase-1 data folder (or of a run "
                        "folder's data); --input, --vocab, --cased/--uncased still override")
    _add_case_args(p)
    p.add_argument("--num-shards", type=int, default=None,
                   help="output shards (default: 8, or about one per 32 MiB of input text)")
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--max-predictions-per-seq", type=int, default=20)
    p.add_argument("--masked-lm-prob", type=float, default=0.15)
    p.add_argument("--short-seq-prob", type=float, default=0.1)
    p.add_argument("--dupe-factor", type=int, default=5)
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--overwrite", action="store_true", help="replace prepared data in --output")
    p.set_defaults(func=_cmd_prepare_bert)

    p = sub.add_parser("prepare-classification",
                       help="a TSV/CSV with a header -> sentence(-pair) classification shards")
    p.add_argument("table", help="the .tsv or .csv file")
    p.add_argument("--output", required=True)
    p.add_argument("--vocab", required=True, help="the checkpoint's vocabulary: a vocab.txt, a "
                                                  "tokenizer.json, or the checkpoint folder itself")
    from hvd_bert.data.glue import TASKS  # numpy only

    p.add_argument("--task", choices=sorted(TASKS),
                   help="a GLUE task's published TSV (its columns, header and labels); reports its metric")
    p.add_argument("--text-a", help="column of the (first) sentence (a table without --task)")
    p.add_argument("--text-b", help="column of the second sentence, for pairs")
    p.add_argument("--label", help="column of the label")
    p.add_argument("--labels", nargs="*", help="label order (pass the training set's to a dev set)")
    p.add_argument("--regression", action="store_true",
                   help="the label column is a number (fine-tuned with a 1-output head and MSE, as STS-B)")
    _add_case_args(p)
    p.add_argument("--num-shards", type=int, default=2)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_cmd_prepare_classification)

    p = sub.add_parser("prepare-squad", help="a SQuAD v1.1 / v2.0 JSON file -> features as Google's "
                                             "run_squad.py makes them (shards + prediction maps)")
    p.add_argument("--input", required=True, help="train-v1.1.json, dev-v2.0.json, ...")
    p.add_argument("--output", required=True)
    p.add_argument("--vocab", required=True, help="the checkpoint's vocabulary: a vocab.txt, a "
                                                  "tokenizer.json, or the checkpoint folder itself")
    p.add_argument("--split", choices=["train", "dev"], default="train",
                   help="train: with answer positions (one answer per question); dev: for prediction")
    p.add_argument("--version-2-with-negative", action="store_true",
                   help="SQuAD v2.0: questions may have no answer (is_impossible)")
    _add_case_args(p)
    p.add_argument("--max-seq-length", type=int, default=384)
    p.add_argument("--doc-stride", type=int, default=128)
    p.add_argument("--max-query-length", type=int, default=64)
    p.add_argument("--num-shards", type=int, default=8)
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_cmd_prepare_squad)

    p = sub.add_parser("prepare-ncf", help="MovieLens ratings or synthetic data -> NCF implicit "
                                           "feedback with a leave-one-out test")
    p.add_argument("--output", required=True)
    p.add_argument("--movielens", help="MovieLens ratings, told apart by content: ratings.csv (ml-20m, "
                                       "ml-25m, ml-latest), ratings.dat (ml-1m, ml-10m), u.data (ml-100k), "
                                       "or its folder")
    p.add_argument("--eval-negatives", type=int, choices=[100, 999], default=100,
                   help="negatives each held-out item is ranked among: 100 (NCF paper, NVIDIA; HR@10 ~0.96 "
                        "on ml-20m) or 999 (MLPerf; target HR@10 0.635 on ml-20m)")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="drop malformed rating lines (say how many) instead of stopping at the first")
    p.add_argument("--synthetic", default="ml-1m", choices=["ml-1m", "ml-20m"],
                   help="synthetic data of this size when no --movielens is given (default ml-1m)")
    p.add_argument("--scale", type=float, default=1.0, help="scale the synthetic users and interactions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_cmd_prepare_ncf)

    for name, (text, *_) in JOBS.items():
        p = sub.add_parser(name, help=text)
        p.add_argument("--framework", choices=["pt", "tf"], default=None,
                       help="pt (PyTorch, the default) or tf (TensorFlow): the config's framework")
        if name == "finetune":
            p.add_argument("--task", help="squad, classification, regression or a GLUE task: checked against "
                                          "the prepared data (which decides the head and the metrics)")
        _add_config_args(p)
        p.set_defaults(func=_cmd_job)

    p = sub.add_parser("evaluate-squad", help="SQuAD v1.1 / v2.0 exact match and F1 of a predictions "
                                              "file, as the official evaluation scripts compute them")
    p.add_argument("data_file", help="the SQuAD data file (e.g. dev-v1.1.json, dev-v2.0.json)")
    p.add_argument("pred_file", help="predictions.json: question id -> answer text")
    p.add_argument("--na-prob", help="v2.0: null_odds.json (question id -> no-answer probability); "
                                     "adds the best thresholds")
    p.set_defaults(func=_cmd_evaluate_squad)

    p = sub.add_parser("convert", help="a BERT checkpoint (either framework's, .npz, Hugging Face) -> "
                                       "portable weights (.npz) or a Hugging Face folder")
    p.add_argument("checkpoint", help="ckpt-*.pt, ckpt-*.tf, a run folder (its newest checkpoint), a .npz, "
                                      "or a Hugging Face model folder (config.json + model.safetensors "
                                      "or pytorch_model.bin)")
    p.add_argument("--output", required=True, help="the .npz, or (--to hf) the folder, to write")
    p.add_argument("--to", choices=["npz", "hf", "google"], default="npz",
                   help="npz: portable weights both frameworks load; hf: a folder transformers loads; "
                        "google: a TF1 checkpoint Google's modeling.py loads")
    p.add_argument("--vocab", help="--to hf: the vocab.txt to include (default: the checkpoint's, or "
                                   "its data's)")
    p.add_argument("--cased", action="store_true", help="--to hf: the tokenizer keeps case")
    p.add_argument("--framework", choices=["auto", "pt", "tf"], default="auto",
                   help="which framework reads the checkpoint (auto: from its suffix)")
    p.set_defaults(func=_cmd_convert)

    from hvd_bert.core.cost_model import INTERCONNECTS, WORKLOADS
    p = sub.add_parser("simulate", help="project step time and scaling efficiency on N GPUs "
                                        "(alpha-beta allreduce model)")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="bert-large-p1")
    p.add_argument("--params", type=float, help="a custom model: trainable parameters")
    p.add_argument("--tensors", type=int, default=200, help="custom model: parameter tensors")
    p.add_argument("--micro-batch-seconds", type=float, default=0.1, help="custom: compute per micro-batch")
    p.add_argument("--samples", type=int, default=64, help="custom: samples per micro-batch")
    p.add_argument("--gpus", type=int, nargs="+", default=[1, 16, 128, 512, 1472])
    p.add_argument("--interconnect", choices=sorted(INTERCONNECTS), default="dgx2h")
    p.add_argument("--algorithm", choices=["ring", "tree", "hierarchical"], default="hierarchical")
    p.add_argument("--fusion-mb", type=float, default=128, help="tensor fusion buffer (0: no fusion)")
    p.add_argument("--fp16", action="store_true", help="fp16 gradient compression")
    p.add_argument("--no-overlap", action="store_true", help="reductions after the backward pass")
    p.add_argument("--k", type=int, default=1, help="backward_passes_per_step")
    p.add_argument("--bert-recipe", action="store_true",
                   help="also project NVIDIA's BERT-Large LAMB recipe (both phases) on the last --gpus")
    p.add_argument("--calibrate", action="store_true",
                   help="fit alpha and bandwidth from allreduces measured here (flat network)")
    p.add_argument("--calibrate-np", type=int, help="ranks to measure with (2; with --calibrate-hosts: "
                                                    "every slot)")
    p.add_argument("--calibrate-hosts", help="measure across these hosts (horovodrun -H syntax, e.g. "
                                             "node1:2,node2:2; run it on the first of them)")
    p.add_argument("--calibrate-nic", help="with --calibrate-hosts: the network interface (e.g. eth0)")
    p.set_defaults(func=_cmd_simulate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Every subcommand through one error handler: a user error (settings, data, checkpoint,
    weights, a diverged run) is one line naming the problem and the fix, exit status 2, on
    every rank; anything else is a bug and keeps its traceback."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except user_errors() as e:
        hint = getattr(args, "error_hint", None)
        print(f"hvd-bert {args.command}: {e}{hint(e) if hint else ''}", file=sys.stderr, flush=True)
        _let_peers_report()
        return 2
    except Exception as e:
        if not _peer_failed(e):
            raise
        # Another rank stopped (a user error it reported, or a crash with its traceback) while
        # this one waited in a collective: one line here instead of Horovod's traceback.
        print(f"hvd-bert {args.command}: stopped because another rank failed (its message is in "
              f"that rank's output); nothing more was written", file=sys.stderr, flush=True)
        return 2


def _let_peers_report(grace_s: float = 2.0) -> None:
    """After a user error on a rank of a Horovod job: shut Horovod down now (the ranks waiting
    in a collective then raise at once and print their own line) and wait a moment before
    exiting, since a launcher kills the remaining ranks as soon as one exits."""
    import time

    for name in ("horovod.torch", "horovod.tensorflow"):
        hvd = sys.modules.get(name)
        try:
            if hvd is not None and hvd.is_initialized() and hvd.size() > 1:
                hvd.shutdown()
                time.sleep(grace_s)
                return
        except Exception:  # noqa: BLE001 - only a courtesy to the other ranks
            return


def _peer_failed(e: BaseException | None) -> bool:
    """Whether ``e`` (or an exception it came from) is Horovod's "has been shut down" error,
    which every framework raises in the ranks left waiting when one rank ends."""
    seen = 0
    while e is not None and seen < 10:
        if "Horovod has been shut down" in str(e):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False
