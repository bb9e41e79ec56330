"""The data-preparation commands of ``hvd-bert`` (``prepare-bert``, ``prepare-classification``,
``prepare-token-classification``, ``prepare-squad``, ``prepare-ncf``): each turns its inputs into
shards in ``--output``, which must not be, hold or lie inside what it reads (:func:`refuse_clash_of`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["COMMANDS", "inputs_of", "refuse_clash_of"]


def inputs_of(paths) -> list[str]:
    """The paths a command reads, its globs expanded."""
    import glob

    out = []
    for p in paths or []:
        if p:
            p = str(Path(p).expanduser())
            out += glob.glob(p) if glob.has_magic(p) else [p]
    return out


def refuse_clash_of(args: argparse.Namespace, *reads) -> None:
    """A data preparation's ``--output`` folder must not be, hold or lie inside what it reads."""
    from hvd_bert.files import refuse_clash

    named = {}
    for desc, paths in reads:
        for i, p in enumerate(inputs_of(paths if isinstance(paths, list) else [paths])):
            named[f"{desc} {i + 1}" if isinstance(paths, list) and len(paths) > 1 else desc] = p
    refuse_clash(args.output, named, folder=True)
    from hvd_bert.train.run_folder import refuse_run_files

    refuse_run_files(args.output, args.command)


def prepare_bert_command(args: argparse.Namespace) -> int:
    from hvd_bert.cluster.processes import mpi_world
    from hvd_bert.data.defaults import default_corpus
    from hvd_bert.data.pretraining import PretrainingSettings, like_phase_one, prepare_bert
    from hvd_bert.data.vocab import vocab_and_case

    refuse_clash_of(args, ("the input", args.input), ("the vocabulary", args.vocab), ("--like", args.like))
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
        # (what --like resolved to is read too: the phase-1 text, vocabulary and data folder)
        from hvd_bert.weights.convert import data_folder_of

        refuse_clash_of(args, *((f"--like's input {i}", i) for i in (args.input or [])),
                      ("--like's vocabulary", args.vocab),
                      ("--like's data folder", data_folder_of(Path(args.vocab)) if args.vocab else None))
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
        if vocab is None and meta["vocab_size"] < args.vocab_size:
            print(f"note: the corpus gave a vocab of {meta['vocab_size']} tokens, fewer than --vocab-size "
                  f"{args.vocab_size}: it holds no more distinct word pieces")
        if vocab is None:  # tokenizers' trainer breaks frequency ties in hash order (tokenizers#1794)
            print(f"the vocab was trained here and training is not bit-reproducible; to make the same "
                  f"shards again, pass --vocab {Path(args.output) / 'vocab.txt'}")
    return 0


def prepare_classification_command(args: argparse.Namespace) -> int:
    from hvd_bert.data.classification import prepare_classification
    from hvd_bert.data.vocab import vocab_and_case

    refuse_clash_of(args, ("the table", args.table), ("the vocabulary", args.vocab))
    vocab, lower = vocab_and_case(args.vocab, args.cased, args.uncased)
    meta = prepare_classification(args.table, args.output, vocab, text_a=args.text_a, text_b=args.text_b,
                                  label=args.label, max_seq_length=args.max_seq_length,
                                  num_shards=args.num_shards, do_lower_case=lower, labels=args.labels,
                                  overwrite=args.overwrite, task=args.task, regression=args.regression)
    what = "a numeric label (regression)" if meta["regression"] else f"{len(meta['labels'])} labels"
    print(f"wrote {meta['total_records']} examples ({what}) to {args.output}")
    return 0


def prepare_token_classification_command(args: argparse.Namespace) -> int:
    from hvd_bert.data.token_classification import prepare_token_classification
    from hvd_bert.data.vocab import vocab_and_case

    refuse_clash_of(args, ("the CoNLL file", args.conll), ("the vocabulary", args.vocab))
    vocab, lower = vocab_and_case(args.vocab, args.cased, args.uncased)
    meta = prepare_token_classification(args.conll, args.output, vocab, max_seq_length=args.max_seq_length,
                                        num_shards=args.num_shards, do_lower_case=lower, labels=args.labels,
                                        overwrite=args.overwrite)
    print(f"wrote {meta['sentences']} sentences ({meta['words']} words, {meta['total_records']} records, "
          f"tags {meta['labels']}) to {args.output}")
    return 0


def prepare_squad_command(args: argparse.Namespace) -> int:
    from hvd_bert.cluster.processes import mpi_world
    from hvd_bert.data.squad import prepare_squad
    from hvd_bert.data.vocab import vocab_and_case

    refuse_clash_of(args, ("the input", args.input), ("the vocabulary", args.vocab))
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


def prepare_ncf_command(args: argparse.Namespace) -> int:
    from hvd_bert.data.ncf import prepare_ncf

    refuse_clash_of(args, ("the ratings", args.movielens))
    meta = prepare_ncf(args.output, movielens=args.movielens,
                       synthetic=None if args.movielens else args.synthetic,
                       synthetic_scale=args.scale, seed=args.seed, overwrite=args.overwrite,
                       eval_negatives=args.eval_negatives, skip_bad_lines=args.skip_bad_lines,
                       report=lambda m: print(f"warning: {m}", file=sys.stderr))
    print(f"{meta['source']}: {meta['n_users']} users, {meta['n_items']} items, "
          f"{meta['train_interactions']} training interactions, leave-one-out test with "
          f"{meta['test_negatives']} negatives per user -> {args.output}")
    return 0


COMMANDS = {"prepare_bert": prepare_bert_command, "prepare_classification": prepare_classification_command,
            "prepare_token_classification": prepare_token_classification_command,
            "prepare_squad": prepare_squad_command, "prepare_ncf": prepare_ncf_command}
