"""The ``hvd-bert`` command (also ``python -m hvd_bert``).

    hvd-bert doctor                 check the installation with real 2-process runs
    hvd-bert config [--explain]     print the resolved configuration or its documentation
    hvd-bert prepare-bert           text -> BERT pretraining shards (mpirun: across ranks)
    hvd-bert prepare-classification TSV/CSV -> sentence(-pair) classification shards
    hvd-bert prepare-token-classification CONLL -> token classification (NER) shards
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
    section = getattr(cls, "JOB_SECTION", "")  # the engine's settings alone: under the jobs' names
    if args.explain:
        print("\n".join(C.explain(cls, f"{section}." if section else "")))
        return 0
    cfg = C.load_config(cls, args.config, args.overrides)  # a ConfigError: main's one-line exit 2
    out = {section: C.to_dict(cfg)} if section else C.to_dict(cfg)
    print(yaml.safe_dump(out, sort_keys=False), end="")
    return 0


def _cmd_job(args: argparse.Namespace) -> int:
    """Every training job: the config (recipe, --set, --framework), then ``jobs.run_job``; with
    ``-np N``, N ranks of the same command through ``hvd-bert launch``."""
    from hvd_bert.config import JOB_CONFIGS, load_config
    from hvd_bert.jobs import run_job

    if args.np is not None:
        from hvd_bert.cli_args import without_launch_flags
        from hvd_bert.cluster.launcher import launch_job

        return launch_job(without_launch_flags(args.argv), args.np, hosts=args.hosts, launcher=args.launcher,
                          nic=args.nic)
    overrides = list(args.overrides) + ([f"framework={args.framework}"] if args.framework else [])
    overrides += [f"task={args.task}"] if getattr(args, "task", None) else []
    for key in ("checkpoint", "input", "output", "text_a", "text_b", "id", "label", "pick"):  # predict's
        if getattr(args, key, None):  # (quoted: a path or column name stays a string)
            overrides.append(f"{key}={json.dumps(getattr(args, key))}")
    cfg = load_config(JOB_CONFIGS[args.command], args.config, overrides)
    args.loaded = cfg  # (an out-of-memory line names the fix that applies to these settings)
    return run_job(args.command, cfg, on_data_error=lambda hint: setattr(args, "error_hint", hint))


def _cmd_launch(args: argparse.Namespace) -> int:
    import shutil

    from hvd_bert.cluster.launcher import MPI_COMMANDS, launch_job, rank_command
    from hvd_bert.jobs import JOBS

    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    if not job:
        raise UsageError(f"give what to run after --: a job ({', '.join([*JOBS, *MPI_COMMANDS])}) or python "
                         f"SCRIPT [ARGS]: "
                         f"hvd-bert launch -np 2 -- pretrain, or hvd-bert launch -np 2 -- python train.py")
    python, argv = rank_command(job)
    user = argv[2:] if argv[:2] == ["-m", "hvd_bert.cluster.run_script"] else None  # a user's script
    if python and not shutil.which(python) and not Path(python).is_file():
        raise UsageError(f"{job[0]} is not a program here: give a job ({', '.join([*JOBS, *MPI_COMMANDS])}) "
                         f"or python SCRIPT")
    script = user[0] if user and user[0] != "-m" else None
    if user is not None and not user:
        raise UsageError("give the script after python: hvd-bert launch -np 2 -- python SCRIPT [ARGS]")
    if script and not Path(script).is_file():
        raise UsageError(f"{script} is neither a job ({', '.join([*JOBS, *MPI_COMMANDS])}) nor a script "
                         f"here: give a job, or "
                         f"the path of your script (hvd-bert launch -np 2 -- python SCRIPT [ARGS])")
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
                  cased=args.cased, pick=args.pick, overwrite=args.overwrite))
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
        if args.tensors > args.params:
            raise UsageError(f"--tensors {args.tensors} is more tensors than the model's {args.params:g} "
                             f"--params: each tensor holds at least one parameter")
        w = S.Workload("custom", args.params, args.tensors, args.micro_batch_seconds, args.samples)
    else:
        w = S.WORKLOADS[args.workload]
    fusion = None if args.fusion_mb == 0 else args.fusion_mb * S.MIB
    print("\n".join(S.report(w, net, args.gpus, bert_recipe=args.bert_recipe, fusion_mb=args.fusion_mb,
                              fusion_bytes=fusion, algorithm=args.algorithm, fp16=args.fp16,
                              overlap=not args.no_overlap, backward_passes_per_step=args.k)))
    if args.model_size:
        from hvd_bert.core.model_size import BERT_SHAPES, report_model_size

        shape = None if args.params is not None else BERT_SHAPES.get(args.workload)
        print("\n".join(report_model_size(w, shape, args.gpus[-1], net, device_gb=args.device_gb,
                                           algorithm=args.algorithm, mixed=not args.fp32_state, k=args.k,
                                           fp16=args.fp16, fusion_bytes=fusion)))
    return 0


def _cmd_k8s(args) -> int:
    """``hvd-bert k8s render``: the job's Kubernetes resources (``hvd_bert.cluster.k8s``)."""
    from pathlib import Path

    from hvd_bert.cluster import k8s
    from hvd_bert.files import atomic_write

    spec = k8s.Spec(args.kind, args.job, args.name, args.image, workers=args.workers,
                    gpus_per_worker=args.gpus_per_worker, slots_per_worker=args.slots_per_worker,
                    namespace=args.namespace, config=args.config, sets=args.sets, framework=args.framework,
                    data_claim=args.data_claim, runs_claim=args.runs_claim, shm_gb=args.shm_gb,
                    grace_s=args.grace_s, backoff_limit=args.backoff_limit)
    import hvd_bert
    from hvd_bert.jobs.predict_model import refuse_foreign_files

    try:
        text = k8s.to_yaml(k8s.render(spec))
        k8s.check_settings(spec, Path(hvd_bert.__file__).resolve().parent.parent)  # (as the launcher will)
    except k8s.SpecError as e:
        raise UsageError(str(e)) from None
    if not args.output:
        sys.stdout.write(text)
        return 0
    out = Path(args.output)
    if out.is_dir():
        raise UsageError(f"--output {out} is a folder: give the path of the YAML file to write")
    refuse_foreign_files(out, "k8s render")  # (never a run's files or prepared data)
    atomic_write(out, lambda tmp: tmp.write_text(text))
    print(f"wrote {out}: {spec.kind} {spec.name}, {spec.workers} worker(s) x {spec.slots} rank(s); "
          f"kubectl apply -f {out}")
    return 0


TRAINING = ("pretrain", "finetune", "ncf")  # the commands that run the training loop


class UsageError(ValueError):
    """A bad argument of a command: one line, exit status 2."""


def _commands() -> dict:
    from hvd_bert.cli_prepare import COMMANDS as PREPARE

    own = {name[len("_cmd_"):]: fn for name, fn in list(globals().items()) if name.startswith("_cmd_")}
    return {**own, **PREPARE}


COMMANDS = _commands()


def build_parser() -> argparse.ArgumentParser:
    from hvd_bert.cli_args import build_parser as build

    return build(COMMANDS)


def _user_error(command: str, line: str) -> int:
    from hvd_bert.cluster.processes import let_peers_report

    # one write: a launcher that merges the ranks' output cannot cut the line (print writes twice);
    # a control character in a name the user gave (a newline in a file name) is written escaped
    line = "".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in line)
    sys.stderr.write(f"hvd-bert {command}: {line}\n")
    sys.stderr.flush()
    let_peers_report()
    return 2


def resource_line(e: BaseException, cfg=None, command: str | None = None) -> str | None:
    """A resource the user must provide, as one line with the fix: disk space, a writable
    folder (``files.os_error_line``), memory (the fix that applies to ``cfg``, the job's
    settings: a smaller batch, or, at one sequence per rank already, a smaller model); None for
    anything else."""
    from hvd_bert.files import os_error_line

    training = command is None or command in ("train", "pretrain", "finetune", "ncf")
    output = "train.output_dir (--output)" if training else "--output"
    if isinstance(e, OSError):  # (a training job writes to train.output_dir, any other command to --output)
        return os_error_line(e, output)
    text = str(e)
    framework_os = _os_error_in(text)  # (a framework's writer reports a file system error in its own type)
    if framework_os is not None:
        return os_error_line(framework_os, output)
    if isinstance(e, MemoryError) or "can't allocate memory" in text or "out of memory" in text.lower() \
            or type(e).__name__ == "ResourceExhaustedError":
        import re

        size = re.search(r"allocate (\d+) bytes", text)
        first = (f"an allocation of {int(size.group(1)) / 2**20:,.0f} MB failed" if size else
                 text.splitlines()[0][:160] if text else type(e).__name__)
        batch = getattr(getattr(getattr(cfg, "train", None), "batch", None), "local_batch_size", None)
        if batch == 1:
            return (f"out of memory ({first}) at one sequence per rank: the model, its optimizer state or "
                    f"its vocabulary does not fit this rank's memory; use a smaller model, max_seq_length or "
                    f"vocabulary, train.zero.stage=2 or train.tensor_parallel over more ranks, or "
                    f"train.precision.mode=bf16")
        return (f"out of memory for this batch ({first}): lower train.batch.local_batch_size and raise "
                f"train.batch.backward_passes_per_step to keep the global batch, or use "
                f"train.precision.mode=bf16; if the model itself does not fit (a large vocabulary, a long "
                f"max_seq_length), use a smaller one, train.zero.stage=2 or train.tensor_parallel")
    return None


def _os_error_in(text: str) -> OSError | None:
    """The file system error a framework's exception reports in its text (TensorFlow's saver
    raises ResourceExhaustedError for a full disk), as the OSError it is; None for anything else."""
    import errno
    import re

    for words, code in (("No space left on device", errno.ENOSPC), ("Disk quota exceeded", errno.EDQUOT),
                        ("Read-only file system", errno.EROFS)):
        if words in text:
            m = re.search(r"(\S+?);? " + re.escape(words), text)
            # (a writer's temporary name: the output meant)
            path = re.sub(r"/\.([^/]+)\.tmp-\d+(/.*)?$", r"/\1", m.group(1)) if m else None
            return OSError(code, words, path)
    return None


def main(argv: list[str] | None = None) -> int:
    """Every subcommand through one error handler: a user error (settings, data, checkpoint,
    weights, a diverged run) is one line naming the problem and the fix, exit status 2, on
    every rank; anything else is a bug and keeps its traceback."""
    from hvd_bert import stop

    argv = list(sys.argv[1:] if argv is None else argv)
    for stream in (sys.stdout, sys.stderr):  # (each line in one write: a launcher tags each write)
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(write_through=False, line_buffering=True)
    # A signal from the first moment on: a rank's or a launcher's is a stop request (the launcher
    # relays it to the ranks it starts, hvd_bert.cluster.launcher), any other command's a stop.
    command = next((a for a in argv if not a.startswith("-")), None)
    launching = command == "launch" or any(a == "-np" or a.startswith("-np=") for a in argv)
    if command in TRAINING or launching:
        stop.STOP.command = f"hvd-bert {command}"
        stop.STOP.install()
    else:
        stop.interrupt_at_once(command or "")
    try:
        return _dispatch(argv)
    except stop.Interrupted as e:
        return stop.interrupted_line(command or "", e)
    except BrokenPipeError:  # (``hvd-bert config --explain | head``: the reader has what it wanted)
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no second error at exit)
        return 0


def _dispatch(argv: list[str]) -> int:
    from hvd_bert.cluster.processes import peer_failed
    from hvd_bert.jobs import user_errors

    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except (*user_errors(), UsageError, ValueError) as e:
        if type(e) is ValueError and not args.command.startswith("prepare-"):
            raise  # a bare ValueError outside data preparation is a bug
        hint = getattr(args, "error_hint", None)
        return _user_error(args.command, f"{e}{hint(e) if hint else ''}")
    except RecursionError:  # (a reader that does not name its file: JSON or YAML nested past the parser)
        return _user_error(args.command, "an input nests its values deeper than Python's JSON and YAML "
                                         "parsers read (a file or --set value of thousands of levels): give "
                                         "the documented format")
    except Exception as e:
        resource = resource_line(e, getattr(args, "loaded", None), args.command)
        if resource is not None:
            return _user_error(args.command, resource)
        if not peer_failed(e):
            raise
        # Another rank stopped (a user error it reported, or a crash with its traceback) while
        # this one waited in a collective: one line here instead of Horovod's traceback.
        sys.stderr.write(f"hvd-bert {args.command}: stopped because another rank failed (its message is in "
                         f"that rank's output); nothing more was written\n")
        sys.stderr.flush()
        return 2
