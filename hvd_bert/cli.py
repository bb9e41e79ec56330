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
import json
import sys
from pathlib import Path


# each job's example recipe and override in --help (tests/core/test_cli.py runs them)
EXAMPLES = {"train": (None, "optim.lr=1e-3"),
            "pretrain": ("recipes/bert-large-phase1.yaml", "train.optim.lr=1e-3"),
            "finetune": ("recipes/glue.yaml", "epochs=2"),
            "ncf": ("recipes/ncf-ladder-1-baseline.yaml", "top_k=20"),
            "predict": (None, "batch_size=32")}


def _add_config_args(p: argparse.ArgumentParser, job: str) -> None:
    recipe, override = EXAMPLES[job]
    p.add_argument("--config", metavar="YAML", help="a YAML recipe, missing keys taking the job's defaults"
                   + (f", e.g. --config {recipe}" if recipe else " (recipes/ has the published ones)"))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override one setting, e.g. --set {override} (repeatable)")


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

    cls = C.JOB_CONFIGS[args.job]
    if args.explain:
        print("\n".join(C.explain(cls)))
        return 0
    cfg = C.load_config(cls, args.config, args.overrides)  # a ConfigError: main's one-line exit 2
    print(yaml.safe_dump(C.to_dict(cfg), sort_keys=False), end="")
    return 0


def _cmd_prepare_bert(args: argparse.Namespace) -> int:
    from hvd_bert.cluster.processes import mpi_world
    from hvd_bert.data.defaults import default_corpus
    from hvd_bert.data.pretraining import PretrainingSettings, like_phase_one, prepare_bert
    from hvd_bert.data.vocab import vocab_and_case

    rank, size, comm = mpi_world()
    say = print if rank == 0 else (lambda *_: None)
    lower = (not args.cased) if (args.cased or args.uncased) else None
    if args.like:
        got = like_phase_one(args.like, inputs=args.input, input_format=args.input_format,
                             sentence_splitter=args.sentence_splitter, vocab=args.vocab, lower_case=lower,
                             say=say)
        args.input, args.input_format, args.sentence_splitter, args.vocab = (
            got["inputs"], got["input_format"], got["sentence_splitter"], got["vocab"])
        args.cased, args.uncased = not got["lower_case"], got["lower_case"]
    vocab, lower = vocab_and_case(args.vocab, args.cased, args.uncased)
    inputs = args.input
    if not inputs:
        corpus, vocab = default_corpus(args.vocab_size, lower, rank == 0, vocab)
        if comm is not None:
            comm.Barrier()
        inputs = [str(corpus)]
        say(f"no --input: using the built-in corpus {corpus} (Python standard library docstrings)")
    settings = PretrainingSettings(
        max_seq_length=args.max_seq_length, max_predictions_per_seq=args.max_predictions_per_seq,
        masked_lm_prob=args.masked_lm_prob, short_seq_prob=args.short_seq_prob,
        dupe_factor=args.dupe_factor, do_lower_case=lower, seed=args.seed)
    meta = prepare_bert(inputs, args.output, vocab_file=vocab, vocab_size=args.vocab_size,
                        num_shards=args.num_shards, settings=settings, rank=rank, world_size=size,
                        comm=comm, overwrite=args.overwrite, input_format=args.input_format,
                        progress=args.progress, unit_bytes=max(1, int(args.split_mb * 2**20)),
                        sentence_splitter=args.sentence_splitter or "syntok")
    if meta is not None:
        print(f"wrote {meta['total_records']} instances in {meta['num_shards']} shards to {args.output} "
              f"(vocab {meta['vocab_size']} tokens, seq {meta['max_seq_length']}, {size} process(es))")
        if vocab is None:  # tokenizers' trainer breaks frequency ties in hash order (tokenizers#1794)
            print(f"the vocab was trained here and training is not bit-reproducible; to make the same "
                  f"shards again, pass --vocab {Path(args.output) / 'vocab.txt'}")
    return 0


def _cmd_prepare_classification(args: argparse.Namespace) -> int:
    from hvd_bert.data.classification import prepare_classification
    from hvd_bert.data.vocab import vocab_and_case

    vocab, lower = vocab_and_case(args.vocab, args.cased, args.uncased)
    meta = prepare_classification(args.table, args.output, vocab, text_a=args.text_a, text_b=args.text_b,
                                  label=args.label, max_seq_length=args.max_seq_length,
                                  num_shards=args.num_shards, do_lower_case=lower, labels=args.labels,
                                  overwrite=args.overwrite, task=args.task, regression=args.regression)
    what = "a numeric label (regression)" if meta["regression"] else f"{len(meta['labels'])} labels"
    print(f"wrote {meta['total_records']} examples ({what}) to {args.output}")
    return 0


def _cmd_prepare_squad(args: argparse.Namespace) -> int:
    from hvd_bert.cluster.processes import mpi_world
    from hvd_bert.data.squad import prepare_squad
    from hvd_bert.data.vocab import vocab_and_case

    rank, size, comm = mpi_world()
    vocab, lower = vocab_and_case(args.vocab, args.cased, args.uncased)
    meta = prepare_squad(args.input, args.output, vocab, do_lower_case=lower,
                         version_2=args.version_2_with_negative, is_training=args.split == "train",
                         max_seq_length=args.max_seq_length, doc_stride=args.doc_stride,
                         max_query_length=args.max_query_length, num_shards=args.num_shards, rank=rank,
                         world_size=size, comm=comm, overwrite=args.overwrite)
    if meta is not None:  # (an error is raised on every rank: prepare_squad agrees on errors)
        print(f"wrote {meta['total_records']} features of {meta['examples']} questions "
              f"({meta['skipped_examples']} skipped: answer not in the context's words) in "
              f"{meta['num_shards']} shards to {args.output} ({size} process(es))")
    return 0


def _cmd_prepare_ncf(args: argparse.Namespace) -> int:
    from hvd_bert.data.ncf import prepare_ncf

    meta = prepare_ncf(args.output, movielens=args.movielens,
                       synthetic=None if args.movielens else args.synthetic,
                       synthetic_scale=args.scale, seed=args.seed, overwrite=args.overwrite,
                       eval_negatives=args.eval_negatives, skip_bad_lines=args.skip_bad_lines,
                       report=lambda m: print(f"warning: {m}", file=sys.stderr))
    print(f"{meta['source']}: {meta['n_users']} users, {meta['n_items']} items, "
          f"{meta['train_interactions']} training interactions, leave-one-out test with "
          f"{meta['test_negatives']} negatives per user -> {args.output}")
    return 0


def _cmd_job(args: argparse.Namespace) -> int:
    """Every training job: the config (recipe, --set, --framework), then ``jobs.run_job``."""
    from hvd_bert.config import JOB_CONFIGS, load_config
    from hvd_bert.jobs import run_job

    overrides = list(args.overrides) + ([f"framework={args.framework}"] if args.framework else [])
    overrides += [f"task={args.task}"] if getattr(args, "task", None) else []
    for key in ("checkpoint", "input", "output", "text_a", "text_b", "id"):  # predict's arguments
        if getattr(args, key, None):  # (quoted: a path or column name stays a string)
            overrides.append(f"{key}={json.dumps(getattr(args, key))}")
    cfg = load_config(JOB_CONFIGS[args.command], args.config, overrides)
    return run_job(args.command, cfg, on_data_error=lambda hint: setattr(args, "error_hint", hint))


def _cmd_launch(args: argparse.Namespace) -> int:
    from hvd_bert.cluster.launcher import launch_job
    from hvd_bert.jobs import JOBS

    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    if not job or job[0] not in JOBS:
        raise UsageError(f"give the job after --, one of {', '.join(JOBS)}: hvd-bert launch -np 2 -- "
                         f"pretrain")
    return launch_job(job, args.np, hosts=args.hosts, launcher=args.launcher, nic=args.nic)


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
    from hvd_bert.weights.convert import convert

    print(convert(args.checkpoint, args.output, to=args.to, framework=args.framework, vocab=args.vocab,
                  cased=args.cased))
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from hvd_bert.core import cost_model as S

    net = S.INTERCONNECTS[args.interconnect]
    if args.calibrate:
        from hvd_bert.cluster.calibrate import calibrate

        try:
            net = calibrate(net, hosts=args.calibrate_hosts, np=args.calibrate_np, nic=args.calibrate_nic)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if net is None:
            return 1
    if args.params is not None:
        w = S.Workload("custom", args.params, args.tensors, args.micro_batch_seconds, args.samples)
    else:
        w = S.WORKLOADS[args.workload]
    fusion = None if args.fusion_mb == 0 else args.fusion_mb * S.MIB
    print("\n".join(S.report(w, net, args.gpus, bert_recipe=args.bert_recipe, fusion_mb=args.fusion_mb,
                              fusion_bytes=fusion, algorithm=args.algorithm, fp16=args.fp16,
                              overlap=not args.no_overlap, backward_passes_per_step=args.k)))
    return 0


class UsageError(ValueError):
    """A bad argument of a command: one line, exit status 2."""


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
    _add_config_args(p, "train")
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

    from hvd_bert.jobs import JOBS

    for name, (text, *_) in JOBS.items():
        p = sub.add_parser(name, help=text)
        p.add_argument("--framework", choices=["pt", "tf"], default=None,
                       help="pt (PyTorch, the default) or tf (TensorFlow): the config's framework")
        if name == "finetune":
            p.add_argument("--task", help="squad, classification, regression or a GLUE task: checked against "
                                          "the prepared data (which decides the head and the metrics)")
        if name == "predict":
            p.add_argument("checkpoint", help="a fine-tuning run folder, its best.npz or a ckpt-* in it, or "
                                              "a Hugging Face BertForSequenceClassification folder")
            p.add_argument("input", help="a TSV/CSV with a header, a .jsonl file, or a prepared folder")
            p.add_argument("--output", help="predictions .jsonl or .tsv (default: INPUT.predictions.jsonl)")
            p.add_argument("--text-a", help="the text's column or field (default: sentence, text or the "
                                            "first column)")
            p.add_argument("--text-b", help="a pair's second text (column or field)")
            p.add_argument("--id", help="a column or field copied into each prediction as its id")
        _add_config_args(p, name)
        p.set_defaults(func=_cmd_job)

    p = sub.add_parser("launch", help="run a job on N ranks (mpirun, or horovodrun --gloo): the job's exit "
                                      "status, a user error once, no launcher traceback",
                       usage="hvd-bert launch -np N [-H HOSTS] [--gloo | --mpi] [--network-interface IF] "
                             "-- JOB [ARGS...]")
    p.add_argument("-np", dest="np", type=int, default=2, help="ranks (default 2)")
    p.add_argument("-H", dest="hosts", help="hosts and slots, e.g. node1:2,node2:2 (default: this machine)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--gloo", dest="launcher", action="store_const", const="gloo",
                     help="horovodrun with Gloo (the default where mpirun is missing)")
    how.add_argument("--mpi", dest="launcher", action="store_const", const="mpi",
                     help="mpirun (the default: faster on CPUs, BENCHMARKS.md)")
    p.add_argument("--network-interface", dest="nic",
                   help="the interface the ranks talk over (several hosts)")
    p.add_argument("job", nargs=argparse.REMAINDER,
                   help="-- then the job and its arguments, e.g. -- pretrain --set "
                        "train.schedule.total_steps=20")
    p.set_defaults(func=_cmd_launch)

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
    from hvd_bert.cluster.processes import let_peers_report, peer_failed
    from hvd_bert.jobs import user_errors

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except (*user_errors(), UsageError, ValueError) as e:
        if type(e) is ValueError and not args.command.startswith("prepare-"):
            raise  # a bare ValueError outside data preparation is a bug
        hint = getattr(args, "error_hint", None)
        # one write: a launcher that merges the ranks' output cannot cut the line (print writes twice)
        sys.stderr.write(f"hvd-bert {args.command}: {e}{hint(e) if hint else ''}\n")
        sys.stderr.flush()
        let_peers_report()
        return 2
    except Exception as e:
        if not peer_failed(e):
            raise
        # Another rank stopped (a user error it reported, or a crash with its traceback) while
        # this one waited in a collective: one line here instead of Horovod's traceback.
        sys.stderr.write(f"hvd-bert {args.command}: stopped because another rank failed (its message is in "
                         f"that rank's output); nothing more was written\n")
        sys.stderr.flush()
        return 2
