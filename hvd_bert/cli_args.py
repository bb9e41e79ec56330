"""The ``hvd-bert`` command's arguments: every subcommand, its options and their help (the
functions they call are ``hvd_bert.cli``'s)."""

from __future__ import annotations

import argparse
import math
from typing import Callable

__all__ = ["build_parser", "EXAMPLES", "without_launch_flags", "int64", "real", "count"]


SHARDS_MAX = 1 << 20  # output shards of a preparation at most
SEQ_MAX = 1 << 16  # a prepared sequence's tokens at most


def int64(text: str) -> int:
    """An integer option: what a 64-bit signed integer holds (the range of every integer setting,
    ``config.base``), so that a seed or a count past it is refused here, not deep in a framework."""
    from hvd_bert.config.base import INT_RANGE

    value = int(text)
    if not INT_RANGE[0] <= value <= INT_RANGE[1]:
        raise argparse.ArgumentTypeError(f"{text} is outside the 64-bit integers ({INT_RANGE[0]} to "
                                         f"{INT_RANGE[1]})")
    return value


def real(low: float, high: float = float("inf"), *, above: bool = False) -> Callable[[str], float]:
    """A number option: finite, at least ``low`` (greater, with ``above``) and at most ``high``;
    ``nan``, ``inf`` and a value out of its range are refused here, in one line."""
    def parse(text: str) -> float:
        value = float(text)
        ok = math.isfinite(value) and (value > low if above else value >= low) and value <= high
        if not ok:
            want = f"{'more than' if above else 'at least'} {low:g}" + (f" and at most {high:g}"
                                                                          if math.isfinite(high) else "")
            raise argparse.ArgumentTypeError(f"{text} is not a finite number {want}")
        return value
    parse.__name__ = "number"  # (argparse's "invalid number value: 'x'" for what is not one)
    return parse


def count(high: int, low: int = 1) -> Callable[[str], int]:
    """A count option: an integer from ``low`` (1) to ``high`` (a simulation's GPUs, tensors,
    samples, accumulation; a preparation's shards and sequence length), refused here in one line
    otherwise."""
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is not a count from {low} to {high}")
        return value
    parse.__name__ = "count"
    return parse


def zero_or(parse: Callable[[str], float]) -> Callable[[str], float]:
    """0 (a setting off), or what ``parse`` takes."""
    def zero(text: str) -> float:
        return 0.0 if float(text) == 0 else parse(text)
    zero.__name__ = parse.__name__
    return zero


def seed(text: str) -> int:
    """A seed option: in [0, 2**31) like ``train.seed`` (numpy takes seeds below 2**32)."""
    from hvd_bert.config.train import SEED_MAX

    value = int(text)
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"{text} is not a seed in [0, {SEED_MAX}]")
    return value


# each job's example recipe and override in --help (tests/core/test_cli.py runs them)
EXAMPLES = {"train": (None, "train.optim.lr=1e-3"),
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


# the settings a job's --help names first (tests/core/test_cli.py checks that each exists)
MOST_USED = {
    "pretrain": ("data", "model", "max_seq_length", "init_checkpoint", "train.optim.lr",
                 "train.batch.global_batch_size", "train.batch.local_batch_size",
                 "train.schedule.total_steps",
                 "train.precision.mode", "train.zero.stage", "train.tensor_parallel", "train.output_dir"),
    "finetune": ("data", "eval_data", "init_checkpoint", "epochs", "train.optim.lr",
                 "train.batch.global_batch_size", "train.precision.mode", "train.output_dir"),
    "ncf": ("data", "epochs", "top_k", "train.optim.lr", "train.batch.local_batch_size", "train.output_dir"),
    "predict": ("batch_size", "max_seq_length", "precision"),
}
EXPLAINED = ("train", "pretrain", "finetune", "ncf", "predict")  # (hvd-bert config --job's choices)

LAUNCH_FLAGS = {"-np": 1, "-H": 1, "--network-interface": 1, "--gloo": 0, "--mpi": 0}  # flag: values


def _add_launch_args(p: argparse.ArgumentParser, default_np: int | None) -> None:
    p.add_argument("-np", dest="np", type=int64, default=default_np,
                   help="ranks to start (mpirun, or horovodrun --gloo)" + (f" (default {default_np})"
                                                                            if default_np else ""))
    p.add_argument("-H", dest="hosts", help="hosts and slots, e.g. node1:2,node2:2 (default: this machine)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--gloo", dest="launcher", action="store_const", const="gloo",
                     help="horovodrun with Gloo (the default where mpirun is missing)")
    how.add_argument("--mpi", dest="launcher", action="store_const", const="mpi",
                     help="mpirun (the default: faster on CPUs, BENCHMARKS.md)")
    p.add_argument("--network-interface", dest="nic",
                   help="the interface the ranks talk over (several hosts)")


def without_launch_flags(argv: list[str]) -> list[str]:
    """``argv`` less the launcher's own flags (what each rank runs)."""
    out, skip = [], 0
    for a in argv:
        if skip:
            skip -= 1
            continue
        name = a.split("=", 1)[0]
        if name in LAUNCH_FLAGS:
            skip = LAUNCH_FLAGS[name] if "=" not in a else 0
            continue
        out.append(a)
    return out


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are the toolkit's one line (the command, what is
    wrong, where the help is) with exit status 2, not the usage block and a second line; its
    subcommands' parsers are of the same class (argparse makes them with ``type(self)``)."""

    def error(self, message: str):
        import sys

        sys.stderr.write(f"{self.prog}: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def _add_case_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cased", action="store_true",
                   help="keep case (default: the checkpoint's, from --vocab, else lower-case)")
    p.add_argument("--uncased", action="store_true", help="lower-case (overrides the checkpoint's)")


def build_parser(commands: dict[str, Callable]) -> argparse.ArgumentParser:
    """The ``hvd-bert`` parser; ``commands``: each subcommand's function (``cli.COMMANDS``)."""
    parser = OneLineParser(
        prog="hvd-bert", description="Distributed large-batch training on Horovod "
                                     "(TensorFlow/Keras and PyTorch).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("doctor", help="check the installation with real 2-process Horovod runs")
    p.add_argument("--np", type=int64, default=2, help="processes per check (default 2)")
    p.add_argument("--timeout", type=real(0, above=True), default=180, help="seconds per distributed check")
    p.add_argument("--no-runs", action="store_true", help="only report versions and the build")
    p.add_argument("--hosts", metavar="H1:SLOTS,H2:SLOTS",
                   help="check these hosts for a multi-node run instead: passwordless ssh, the same "
                        "environment path, a shared folder, the network interface, a cross-host allreduce")
    p.add_argument("--ssh-port", type=int64, help="ssh port of the hosts (default: ssh's)")
    p.set_defaults(func=commands["doctor"])

    p = sub.add_parser("config", help="print the resolved training configuration (YAML)")
    _add_config_args(p, "train")
    p.add_argument("--explain", action="store_true", help="document every setting instead")
    p.add_argument("--job", choices=list(EXPLAINED), default="train",
                   help="whose settings: a job's, or the engine's alone (train)")
    p.set_defaults(func=commands["config"])

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
    p.add_argument("--split-mb", type=real(0, 2**40, above=True), default=64,
                   help="read an uncompressed file larger than this (MiB) in byte ranges of this size, "
                        "cut at document starts and dealt to the ranks (default 64)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="a progress bar on rank 0 when its stderr is a terminal (default on)")
    p.add_argument("--output", required=True, help="output folder")
    p.add_argument("--vocab", help="the WordPiece vocabulary: a vocab.txt, a tokenizer.json, or a "
                                   "checkpoint folder (Hugging Face, Google) holding one (default: train "
                                   "one on the input)")
    p.add_argument("--vocab-size", type=count(1 << 20, 100), default=8192,
                   help="size of a trained vocab (100 to 1048576; a corpus with fewer distinct word pieces "
                        "gives fewer)")
    p.add_argument("--like", metavar="DATA_OR_RUN",
                   help="phase 2: the text, vocab and case of this phase-1 data folder (or of a run "
                        "folder's data); --input, --vocab, --cased/--uncased still override")
    _add_case_args(p)
    p.add_argument("--num-shards", type=count(SHARDS_MAX), default=None,
                   help="output shards (default: 8, or about one per 32 MiB of input text)")
    p.add_argument("--max-seq-length", type=count(SEQ_MAX, 8), default=128)
    p.add_argument("--max-predictions-per-seq", type=count(SEQ_MAX), default=20)
    p.add_argument("--masked-lm-prob", type=real(0, 1), default=0.15)
    p.add_argument("--short-seq-prob", type=real(0, 1), default=0.1)
    p.add_argument("--dupe-factor", type=count(1 << 10), default=5)
    p.add_argument("--seed", type=seed, default=12345)
    p.add_argument("--overwrite", action="store_true", help="replace prepared data in --output")
    p.set_defaults(func=commands["prepare_bert"])

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
    p.add_argument("--num-shards", type=count(SHARDS_MAX), default=2)
    p.add_argument("--max-seq-length", type=count(SEQ_MAX, 3), default=128,
                   help="tokens a sequence holds, [CLS] and [SEP] included (3 to 65536)")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=commands["prepare_classification"])

    p = sub.add_parser("prepare-token-classification",
                       help="a CoNLL-2003 file (word ... tag a line) -> token classification (NER) shards")
    p.add_argument("conll", help="the CoNLL file: the word first and its tag last on each line, a blank line "
                                 "between sentences (eng.train, train.txt, ...)")
    p.add_argument("--output", required=True)
    p.add_argument("--vocab", required=True, help="the checkpoint's vocabulary: a vocab.txt, a "
                                                  "tokenizer.json, or the checkpoint folder itself")
    p.add_argument("--labels", nargs="*", help="tag order (pass the training set's to a dev set)")
    _add_case_args(p)
    p.add_argument("--num-shards", type=count(SHARDS_MAX), default=2)
    p.add_argument("--max-seq-length", type=count(SEQ_MAX, 3), default=128,
                   help="tokens a sequence holds, [CLS] and [SEP] included (3 to 65536)")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=commands["prepare_token_classification"])

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
    p.add_argument("--max-seq-length", type=count(1 << 20), default=384)
    p.add_argument("--doc-stride", type=count(1 << 20), default=128,
                   help="tokens between two windows' starts")
    p.add_argument("--max-query-length", type=count(1 << 20), default=64)
    p.add_argument("--num-shards", type=count(SHARDS_MAX), default=8)
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=commands["prepare_squad"])

    p = sub.add_parser("prepare-ncf", help="MovieLens ratings or synthetic data -> NCF implicit "
                                           "feedback with a leave-one-out test")
    p.add_argument("--output", required=True)
    p.add_argument("--movielens", help="MovieLens ratings, told apart by content: ratings.csv (ml-20m, "
                                       "ml-25m, ml-latest), ratings.dat (ml-1m, ml-10m), u.data (ml-100k), "
                                       "or its folder")
    p.add_argument("--eval-negatives", type=int64, choices=[100, 999], default=100,
                   help="negatives each held-out item is ranked among: 100 (NCF paper, NVIDIA; HR@10 ~0.96 "
                        "on ml-20m) or 999 (MLPerf; target HR@10 0.635 on ml-20m)")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="drop malformed rating lines (say how many) instead of stopping at the first")
    p.add_argument("--synthetic", default="ml-1m", choices=["ml-1m", "ml-20m"],
                   help="synthetic data of this size when no --movielens is given (default ml-1m)")
    p.add_argument("--scale", type=real(0, 1000, above=True), default=1.0,
                   help="scale the synthetic users and interactions")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=commands["prepare_ncf"])

    from hvd_bert.jobs import JOBS

    for name, (text, *_) in JOBS.items():
        p = sub.add_parser(name, help=text, epilog=(
            f"settings: --set KEY=VALUE (or a recipe's keys); every setting with its default and meaning: "
            f"hvd-bert config --job {name} --explain. Most used: {', '.join(MOST_USED[name])}"))
        _add_launch_args(p, None)  # -np N: this command starts the N ranks itself (hvd-bert launch)
        p.add_argument("--framework", choices=["pt", "tf"], default=None,
                       help="pt (PyTorch, the default) or tf (TensorFlow): the config's framework")
        if name == "finetune":
            p.add_argument("--task", help="squad, classification, regression or a GLUE task: checked against "
                                          "the prepared data (which decides the head and the metrics)")
        if name == "predict":
            p.add_argument("checkpoint", help="a fine-tuning run folder, its best.npz or a ckpt-* in it, or "
                                              "a Hugging Face BertForSequenceClassification or "
                                              "BertForQuestionAnswering folder")
            p.add_argument("input", help="a TSV/CSV with a header, a .jsonl file, or a prepared folder; "
                                         "SQuAD: a SQuAD .json file or .jsonl lines of question and context")
            p.add_argument("--output", help="predictions .jsonl or .tsv, SQuAD also .json (default: "
                                            "INPUT.predictions.jsonl, SQuAD: INPUT.predictions.json)")
            p.add_argument("--text-a", help="the text's column or field (default: sentence, text or the "
                                            "first column)")
            p.add_argument("--text-b", help="a pair's second text (column or field)")
            p.add_argument("--id", help="a column or field copied into each prediction as its id")
            p.add_argument("--label", help="a column or field of gold labels (default: label, when the input "
                                           "has one): the predictions are scored, as Trainer.predict does")
            p.add_argument("--checkpoint", dest="pick", choices=["best", "latest"],
                           help="of a run folder: its best evaluated model (best.npz, the default when it "
                                "has one) or its latest checkpoint")
        _add_config_args(p, name)
        p.set_defaults(func=commands["job"])

    p = sub.add_parser("k8s", help="render a job as Kubernetes resources: an MPIJob (Kubeflow MPI Operator) "
                                   "or a Trainer v2 ClusterTrainingRuntime + TrainJob",
                       epilog="e.g. hvd-bert k8s render --kind mpijob --job pretrain --name bert-phase1 "
                              "--image registry.example.com/hvd_bert:gpu --workers 4 --gpus-per-worker 8 "
                              "--config bert-large-phase1 --output phase1.yaml; then: kubectl apply -f "
                              "phase1.yaml (docs/clusters.md)")
    p.add_argument("action", choices=["render"])
    p.add_argument("--kind", choices=["mpijob", "trainjob"], default="mpijob")
    p.add_argument("--job", choices=["pretrain", "finetune"], default="pretrain")
    p.add_argument("--name", required=True, help="the job's name (its run folder: /runs/NAME)")
    p.add_argument("--image", required=True, help="the toolkit's image (make image-gpu, in a registry)")
    p.add_argument("--namespace", default="default")
    p.add_argument("--workers", type=int64, default=2, help="worker pods (default 2)")
    p.add_argument("--gpus-per-worker", type=int64, default=0,
                   help="GPUs per worker, one rank each (default 0: CPU)")
    p.add_argument("--slots-per-worker", type=int64, help="ranks per worker (default: its GPUs, or 1)")
    p.add_argument("--config", help="a recipe: a name under the image's recipes/ (bert-large-phase1) or a "
                                    "path in the image")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the job (repeatable; data=/data/... names the prepared data)")
    p.add_argument("--framework", choices=["pt", "tf"], default="pt")
    p.add_argument("--data-claim", default="hvd-bert-data",
                   help="the PVC with the prepared data, read-only at /data")
    p.add_argument("--runs-claim", default="hvd-bert-runs", help="the PVC of the run folders, at /runs")
    p.add_argument("--shm-gb", type=real(0, above=True), default=16.0, help="each worker's /dev/shm, GiB")
    p.add_argument("--grace-s", type=int64, default=600,
                   help="seconds the job gets to save on SIGTERM (HVD_BERT_STOP_GRACE_S; pods get 60 more)")
    p.add_argument("--backoff-limit", type=int64, default=6, help="launcher restarts (preemptions) allowed")
    p.add_argument("--output", help="write the YAML here (default: standard output)")
    p.set_defaults(func=commands["k8s"])

    p = sub.add_parser("launch", help="run a job on N ranks (mpirun, or horovodrun --gloo): the job's exit "
                                      "status, a user error once, no launcher traceback",
                       usage="hvd-bert launch -np N [-H HOSTS] [--gloo | --mpi] [--network-interface IF] "
                             "-- JOB [ARGS...]")
    _add_launch_args(p, 2)
    p.add_argument("job", nargs=argparse.REMAINDER,
                   help="-- then the job and its arguments, e.g. -- pretrain --set "
                        "train.schedule.total_steps=20")
    p.set_defaults(func=commands["launch"])

    p = sub.add_parser("evaluate-squad", help="SQuAD v1.1 / v2.0 exact match and F1 of a predictions "
                                              "file, as the official evaluation scripts compute them")
    p.add_argument("data_file", help="the SQuAD data file (e.g. dev-v1.1.json, dev-v2.0.json)")
    p.add_argument("pred_file", help="predictions.json: question id -> answer text")
    p.add_argument("--na-prob", help="v2.0: null_odds.json (question id -> no-answer probability); "
                                     "adds the best thresholds")
    p.set_defaults(func=commands["evaluate_squad"])

    p = sub.add_parser("convert", help="a BERT checkpoint (either framework's, .npz, Hugging Face) -> "
                                       "portable weights (.npz) or a Hugging Face folder")
    p.add_argument("checkpoint", help="ckpt-*.pt, ckpt-*.tf, ckpt-*.shards, a run folder (its best model, "
                                      "else its newest checkpoint), a .npz, a Hugging Face model folder "
                                      "(config.json + model.safetensors or pytorch_model.bin) or a Google "
                                      "TF1 checkpoint")
    p.add_argument("--output", required=True, help="the .npz, or (--to hf / google) the folder, to write")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --output folder (once the new one is complete)")
    p.add_argument("--to", choices=["npz", "hf", "google"], default="npz",
                   help="npz: portable weights both frameworks load; hf: a folder transformers loads; "
                        "google: a TF1 checkpoint Google's modeling.py loads")
    p.add_argument("--vocab", help="--to hf / google: the vocab.txt to include (default: the checkpoint's "
                                   "run folder's, or its data's; none found: refused)")
    p.add_argument("--cased", action="store_true", help="--to hf: the tokenizer keeps case")
    p.add_argument("--framework", choices=["auto", "pt", "tf"], default="auto",
                   help="which framework reads the checkpoint (auto: from its suffix)")
    p.add_argument("--checkpoint", dest="pick", choices=["best", "latest"], default="best",
                   help="of a run folder: its best evaluated model (best.npz, the default when it has one) "
                        "or its latest checkpoint")
    p.set_defaults(func=commands["convert"])

    from hvd_bert.core.cost_model import INTERCONNECTS, WORKLOADS
    p = sub.add_parser("simulate", help="project step time and scaling efficiency on N GPUs "
                                        "(alpha-beta allreduce model)")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="bert-large-p1")
    p.add_argument("--params", type=real(1, 1e15), help="a custom model: trainable parameters")
    p.add_argument("--tensors", type=count(10**7), default=200, help="custom model: parameter tensors")
    p.add_argument("--micro-batch-seconds", type=real(1e-9, 1e9), default=0.1,
                   help="custom: compute per micro-batch")
    p.add_argument("--samples", type=count(10**9), default=64, help="custom: samples per micro-batch")
    p.add_argument("--gpus", type=count(10**7), nargs="+", default=[1, 16, 128, 512, 1472])
    p.add_argument("--interconnect", choices=sorted(INTERCONNECTS), default="dgx2h")
    p.add_argument("--algorithm", choices=["ring", "tree", "hierarchical"], default="hierarchical")
    p.add_argument("--fusion-mb", type=zero_or(real(2**-20, 2**20)), default=128,
                   help="tensor fusion buffer in MiB, at least a byte (0: no fusion)")
    p.add_argument("--fp16", action="store_true", help="fp16 gradient compression")
    p.add_argument("--no-overlap", action="store_true", help="reductions after the backward pass")
    p.add_argument("--k", type=count(10**6), default=1, help="backward_passes_per_step")
    p.add_argument("--bert-recipe", action="store_true",
                   help="also project NVIDIA's BERT-Large LAMB recipe (both phases) on the last --gpus")
    p.add_argument("--model-size", action="store_true",
                   help="also project memory per GPU and step time of ZeRO stages 0/1/2 and tensor "
                        "parallelism on the last --gpus, and the largest model each layout holds")
    p.add_argument("--device-gb", type=real(2**-30, 2**20), default=80.0,
                   help="with --model-size: memory per GPU")
    p.add_argument("--fp32-state", action="store_true",
                   help="with --model-size: fp32 training (4+4+8 bytes per parameter, not 2+2+12)")
    p.add_argument("--calibrate", action="store_true",
                   help="fit alpha and bandwidth from allreduces measured here (flat network)")
    p.add_argument("--calibrate-np", type=count(1 << 16),
                   help="ranks to measure with (2; with --calibrate-hosts: "
                                                    "every slot)")
    p.add_argument("--calibrate-hosts", help="measure across these hosts (horovodrun -H syntax, e.g. "
                                             "node1:2,node2:2; run it on the first of them)")
    p.add_argument("--calibrate-nic", help="with --calibrate-hosts: the network interface (e.g. eth0)")
    p.set_defaults(func=commands["simulate"])
    return parser
