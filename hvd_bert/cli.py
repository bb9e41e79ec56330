"""The ``hvd-bert`` command (also ``python -m hvd_bert``).

    hvd-bert doctor                 check the installation with real 2-process runs
    hvd-bert config [--explain]     print the resolved configuration or its documentation
"""

from __future__ import annotations

import argparse
import sys


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="YAML", help="a YAML recipe (missing keys take defaults)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one setting, e.g. --set optim.lr=1e-3 (repeatable)")


def _cmd_doctor(args: argparse.Namespace) -> int:
    from hvd_bert.doctor import run_doctor

    return run_doctor(np=args.np, timeout=args.timeout, runs=not args.no_runs)


def _cmd_config(args: argparse.Namespace) -> int:
    import yaml

    from hvd_bert.common.config import ConfigError, TrainConfig, explain, load_config, to_dict

    if args.explain:
        print("\n".join(explain(TrainConfig)))
        return 0
    try:
        cfg = load_config(TrainConfig, args.config, args.overrides)
    except ConfigError as e:
        print(f"hvd-bert config: {e}", file=sys.stderr)
        return 2
    print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hvd-bert", description="Distributed large-batch training on Horovod "
                                     "(TensorFlow/Keras and PyTorch).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("doctor", help="check the installation with real 2-process Horovod runs")
    p.add_argument("--np", type=int, default=2, help="processes per check (default 2)")
    p.add_argument("--timeout", type=float, default=180, help="seconds per distributed check")
    p.add_argument("--no-runs", action="store_true", help="only report versions and the build")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("config", help="print the resolved training configuration (YAML)")
    _add_config_args(p)
    p.add_argument("--explain", action="store_true", help="document every setting instead")
    p.set_defaults(func=_cmd_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return int(args.func(args) or 0)
