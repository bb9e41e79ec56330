"""SQuAD v1.1 / v2.0 feature conversion, framework-free: Google BERT's ``run_squad.py``
algorithm (``read_squad_examples``, ``convert_examples_to_features``, the improved answer
span and the max-context rule), with WordPiece from the ``tokenizers`` library on each
whitespace token, as Google's ``FullTokenizer`` is applied there.

* The context is split on whitespace (space, tab, CR, LF, U+202F); an answer's character
  offsets map to those words, then to WordPiece tokens; the span is narrowed to the tokens of
  the answer text where they match exactly (``(1895-1943).`` -> ``1895``).
* Training examples whose answer text cannot be found in its words are skipped (counted).
* Long contexts become several features: windows of the document of at most
  ``max_seq_length - len(question) - 3`` tokens, starting ``doc_stride`` tokens apart; a
  training feature whose window misses the answer (and every v2.0 impossible one) points at
  ``[CLS]`` (0, 0).
* Features are numbered ``1000000000 + n`` in example order, as Google's are.

``prepare_squad`` writes them as TFRecord shards in Google's feature names (``unique_ids``,
``input_ids``, ``input_mask``, ``segment_ids``; training adds ``start_positions``,
``end_positions``, ``is_impossible``), example ``e`` going to shard ``e mod N`` and
the shards split over the ranks under mpirun; the tokens and maps that prediction needs go
to ``features.jsonl`` (and the examples to ``examples.jsonl``). The output is the same bytes
for 1 or N processes.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from hvd_bert.cluster.processes import rank_tag
from hvd_bert.data.kinds import KIND_SQUAD
from hvd_bert.data.records import DatasetError, shard_name, write_examples
from hvd_bert.data.sidecar import file_sha256, write_sidecar
from hvd_bert.data.squad_json import read_squad_json, squad_error

__all__ = ["SquadExample", "read_squad", "read_questions", "convert_examples", "prepare_squad", "KIND_SQUAD",
           "FIRST_UNIQUE_ID"]

FIRST_UNIQUE_ID = 1000000000


@dataclass
class SquadExample:
    qas_id: str
    question_text: str
    doc_tokens: list[str]
    orig_answer_text: str | None = None
    start_position: int | None = None
    end_position: int | None = None
    is_impossible: bool = False
    answers: list[str] = field(default_factory=list)


def _is_whitespace(c: str) -> bool:
    return c in " \t\r\n" or ord(c) == 0x202F


def read_squad(data: dict, is_training: bool, version_2: bool, source: str = "the SQuAD file"
               ) -> tuple[list[SquadExample], int]:
    """``(examples, skipped)`` from a parsed SQuAD file (``skipped``: training answers whose text
    is not in the context's words)."""
    examples, skipped = [], 0
    for entry in data["data"]:
        for paragraph in entry["paragraphs"]:
            doc_tokens: list[str] = []
            char_to_word: list[int] = []
            prev_ws = True
            for c in paragraph["context"]:
                if _is_whitespace(c):
                    prev_ws = True
                else:
                    if prev_ws:
                        doc_tokens.append(c)
                    else:
                        doc_tokens[-1] += c
                    prev_ws = False
                char_to_word.append(len(doc_tokens) - 1)
            for qa in paragraph["qas"]:
                ex = SquadExample(qa["id"], qa["question"], doc_tokens,
                                  answers=[a["text"] for a in qa.get("answers", [])])
                if is_training:
                    ex.is_impossible = bool(qa.get("is_impossible", False)) if version_2 else False
                    if len(qa["answers"]) != 1 and not ex.is_impossible:
                        raise DatasetError(f"{source}: question {qa['id']} has {len(qa['answers'])} answers; "
                                           f"for training each has exactly 1 (is this a dev file? "
                                           f"prepare it with --split dev)")
                    if ex.is_impossible:
                        ex.start_position = ex.end_position = -1
                        ex.orig_answer_text = ""
                    else:
                        answer = qa["answers"][0]
                        text, offset = answer["text"], answer["answer_start"]
                        if not 0 <= offset < len(char_to_word) or offset + len(text) > len(char_to_word):
                            raise DatasetError(f"{source}: question {qa['id']}: answer_start {offset} is "
                                               f"outside its context")
                        ex.orig_answer_text = text
                        ex.start_position = char_to_word[offset]
                        ex.end_position = char_to_word[offset + len(text) - 1]
                        actual = " ".join(doc_tokens[ex.start_position:ex.end_position + 1])
                        if actual.find(" ".join(text.split())) == -1:
                            skipped += 1
                            continue
                examples.append(ex)
    return examples, skipped


def read_questions(path: str | Path) -> tuple[list[SquadExample], dict | None]:
    """Questions to answer and their contexts: a SQuAD file (``{"data": [...]}``; returned as the
    second item when it holds answers, to score against) or JSON lines ``{"question": ...,
    "context": ..., "id": ...}`` (``id`` optional: the line number)."""

    p = Path(path).expanduser()
    if p.suffix.lower() == ".jsonl":
        paragraphs = []
        try:
            lines = p.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            raise DatasetError(f"{p} does not exist: check the path") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as e:
                raise DatasetError(f"{p} line {n} is not JSON ({e.msg}): one object per line") from None
            if not isinstance(row, dict) or not all(isinstance(row.get(k), str)
                                                    for k in ("question", "context")):
                raise DatasetError(f"{p} line {n}: give each line a \"question\" and a \"context\" "
                                   f"(strings), e.g. {{\"question\": \"Who?\", \"context\": \"...\"}}")
            from hvd_bert.data.squad_json import has_text

            empty = [k for k in ("question", "context") if not has_text(row[k])]
            if empty:
                raise DatasetError(f"{p} line {n}: its {empty[0]} has no text (empty, or spaces and "
                                   f"invisible characters); give the text, or drop the line")
            rid = row.get("id", n)
            if not isinstance(rid, (str, int)) or isinstance(rid, bool):
                raise DatasetError(f"{p} line {n}: its \"id\" is {rid!r}; give a string or a whole number")
            paragraphs.append({"context": row["context"],
                               "qas": [{"id": str(rid), "question": row["question"]}]})
        data, gold = {"data": [{"paragraphs": paragraphs}]}, False
        error = squad_error(data, str(p))  # (the limits)
        if error:
            raise DatasetError(error)
    else:
        data = read_squad_json(p, "SQuAD file")
        gold = any(qa.get("answers") for a in data["data"] for par in a.get("paragraphs", [])
                   for qa in par.get("qas", []))
    try:
        examples, _ = read_squad(data, False, False, str(p))
    except (KeyError, TypeError) as e:
        raise DatasetError(f"{p} is not in SQuAD's format ({e!r} missing)") from None
    from collections import Counter

    twice = [i for i, c in Counter(e.qas_id for e in examples).items() if c > 1]
    if twice:
        dup = twice[0]
        raise DatasetError(f"{p}: question id {dup!r} is given twice; every question needs its own id")
    if not examples:
        raise DatasetError(f"{p} holds no questions")
    return examples, data if gold else None


def _improve_answer_span(doc_tokens, start, end, tokenize, answer_text):
    tok_answer = " ".join(tokenize(answer_text))
    for new_start in range(start, end + 1):
        for new_end in range(end, new_start - 1, -1):
            if " ".join(doc_tokens[new_start:new_end + 1]) == tok_answer:
                return new_start, new_end
    return start, end


def _is_max_context(spans, cur, position) -> bool:
    best_score, best = None, None
    for i, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best = score, i
    return cur == best


def convert_examples(examples: Sequence[SquadExample], tokenize_words: Callable[[list[str]], list[list[str]]],
                     vocab: dict[str, int], max_seq_length: int = 384, doc_stride: int = 128,
                     max_query_length: int = 64, is_training: bool = True,
                     example_indices: Sequence[int] | None = None) -> list[dict]:
    """Google's features for ``examples`` (``example_indices``: their indices in the whole
    file; ``unique_id`` is left to the caller, who knows the features of the other examples).
    ``tokenize_words(words)`` gives each word's WordPiece tokens."""
    def tokenize(text: str) -> list[str]:
        return [t for w in tokenize_words(text.split()) for t in w]

    unk = vocab["[UNK]"]
    features = []
    for n, ex in enumerate(examples):
        query = tokenize(ex.question_text)[:max_query_length]
        tok_to_orig, orig_to_tok, doc = [], [], []
        for i, subs in enumerate(tokenize_words(ex.doc_tokens)):
            orig_to_tok.append(len(doc))
            for s in subs:
                tok_to_orig.append(i)
                doc.append(s)
        tok_start = tok_end = None
        if is_training and ex.is_impossible:
            tok_start = tok_end = -1
        if is_training and not ex.is_impossible:
            tok_start = orig_to_tok[ex.start_position]
            tok_end = (orig_to_tok[ex.end_position + 1] - 1 if ex.end_position < len(ex.doc_tokens) - 1
                       else len(doc) - 1)
            tok_start, tok_end = _improve_answer_span(doc, tok_start, tok_end, tokenize, ex.orig_answer_text)
        max_doc = max_seq_length - len(query) - 3
        if max_doc < 1:
            raise DatasetError(f"max_seq_length {max_seq_length} leaves no room for the document after a "
                               f"question of {len(query)} tokens: raise it or lower max_query_length")
        spans, start = [], 0
        while start < len(doc):
            length = min(len(doc) - start, max_doc)
            spans.append((start, length))
            if start + length == len(doc):
                break
            start += min(length, doc_stride)
        for si, (span_start, span_len) in enumerate(spans):
            tokens = ["[CLS]", *query, "[SEP]"]
            segment_ids = [0] * len(tokens)
            to_orig, max_ctx = {}, {}
            for i in range(span_len):
                j = span_start + i
                to_orig[len(tokens)] = tok_to_orig[j]
                max_ctx[len(tokens)] = _is_max_context(spans, si, j)
                tokens.append(doc[j])
                segment_ids.append(1)
            tokens.append("[SEP]")
            segment_ids.append(1)
            input_ids = [vocab.get(t, unk) for t in tokens]
            pad = max_seq_length - len(input_ids)
            feat = {"example_index": example_indices[n] if example_indices is not None else n,
                    "doc_span_index": si, "tokens": tokens, "token_to_orig_map": to_orig,
                    "token_is_max_context": max_ctx, "input_ids": input_ids + [0] * pad,
                    "input_mask": [1] * len(input_ids) + [0] * pad, "segment_ids": segment_ids + [0] * pad,
                    "start_position": None, "end_position": None, "is_impossible": ex.is_impossible}
            if is_training:
                if ex.is_impossible or not (span_start <= tok_start and tok_end <= span_start + span_len - 1):
                    feat["start_position"] = feat["end_position"] = 0
                else:
                    offset = len(query) + 2
                    feat["start_position"] = tok_start - span_start + offset
                    feat["end_position"] = tok_end - span_start + offset
            features.append(feat)
    return features


def _wordpiece(vocab_file: Path, do_lower_case: bool):
    from hvd_bert.data.vocab import load_tokenizer

    tok = load_tokenizer(vocab_file, do_lower_case)

    def tokenize_words(words: list[str]) -> list[list[str]]:
        return [e.tokens for e in tok.encode_batch(words, add_special_tokens=False)] if words else []
    return tok, tokenize_words


def _record(feat: dict, is_training: bool) -> dict:
    rec = {"unique_ids": ([feat["unique_id"]], "int"), "input_ids": (feat["input_ids"], "int"),
           "input_mask": (feat["input_mask"], "int"), "segment_ids": (feat["segment_ids"], "int")}
    if is_training:
        rec.update(start_positions=([feat["start_position"]], "int"),
                   end_positions=([feat["end_position"]], "int"),
                   is_impossible=([int(feat["is_impossible"])], "int"))
    return rec


def prepare_squad(input_file: str | Path, output_dir: str | Path, vocab_file: str | Path, *,
                  do_lower_case: bool = True, version_2: bool = False, is_training: bool = True,
                  max_seq_length: int = 384, doc_stride: int = 128, max_query_length: int = 64,
                  num_shards: int = 8, rank: int = 0, world_size: int = 1, comm=None,
                  overwrite: bool = False, log=print) -> dict | None:
    """Features of a SQuAD file in ``output_dir`` (see the module docstring); under mpirun
    rank r converts shards r, r+P, ...; rank 0 writes the sidecar and the prediction files.
    Returns the sidecar on rank 0."""

    from hvd_bert.data.output import agree, stage_folder

    out, src = Path(output_dir), Path(input_file)
    examples, skipped, err = [], 0, None
    try:
        data = read_squad_json(src, "SQuAD file")
        examples, skipped = read_squad(data, is_training, version_2, str(src))
        if not examples:
            raise DatasetError(f"{src} holds no usable questions")
        if num_shards < 1:
            raise DatasetError(f"num_shards must be >= 1, got {num_shards}")
        if doc_stride < 1 or max_query_length < 1:
            raise DatasetError(f"--doc-stride and --max-query-length must be at least 1 (got {doc_stride} "
                               f"and {max_query_length}): the windows must move on, and a question needs "
                               f"a token")
        if max_seq_length - max_query_length - 3 < 1:
            raise DatasetError(f"--max-seq-length {max_seq_length} leaves no room for the context after a "
                               f"question of --max-query-length {max_query_length} and 3 special tokens; "
                               f"raise it or lower --max-query-length")
        num_shards = min(num_shards, len(examples))  # (small data: no empty shard)
    except (DatasetError, KeyError, TypeError) as e:
        err = str(e) if isinstance(e, DatasetError) else f"{src} is not in SQuAD's format ({e!r} missing)"
    agree(comm, err)
    tmp = None  # (the folder beside out the ranks write into, committed into out at the end)
    if rank == 0:
        try:
            words = Path(vocab_file).read_bytes()  # (read first: it may live in out)
            tmp = stage_folder(out, overwrite)
            from hvd_bert.files import atomic_write

            atomic_write(tmp / "vocab.txt", lambda t: t.write_bytes(words))
        except OSError as e:
            err = f"cannot write to {out}: {e.strerror}"
        except DatasetError as e:
            err = str(e)
    if comm is not None:
        err, tmp = comm.bcast((err, tmp), root=0)
    try:
        agree(None, err)
        return _write_squad(tmp, out, rank, world_size, comm, examples, skipped, num_shards, data, src,
                            vocab_settings=(do_lower_case, version_2, is_training, max_seq_length, doc_stride,
                                            max_query_length), log=log)
    finally:
        if rank == 0 and tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _write_squad(tmp: Path, out: Path, rank: int, world_size: int, comm, examples, skipped: int,
                 num_shards: int, data: dict, src: Path, vocab_settings: tuple, log) -> dict | None:
    """The features of every shard written into ``tmp`` (each rank its own), then on rank 0 the
    prediction files and the sidecar, and ``tmp`` committed into ``out``."""
    from hvd_bert.data.output import agree, commit_folder

    do_lower_case, version_2, is_training, max_seq_length, doc_stride, max_query_length = vocab_settings
    tok, tokenize_words = _wordpiece(tmp / "vocab.txt", do_lower_case)
    vocab = tok.get_vocab()
    mine = {s: convert_examples([examples[e] for e in range(s, len(examples), num_shards)], tokenize_words,
                                vocab, max_seq_length, doc_stride, max_query_length, is_training,
                                list(range(s, len(examples), num_shards)))
            for s in range(rank, num_shards, world_size)}
    # Unique ids follow the example order over the whole file: every rank learns the feature
    # counts of every example, then numbers its own.
    counts = [0] * len(examples)
    for feats in mine.values():
        for f in feats:
            counts[f["example_index"]] += 1
    if comm is not None:
        counts = [sum(c) for c in zip(*comm.allgather(counts))]
    first = [FIRST_UNIQUE_ID]
    for c in counts[:-1]:
        first.append(first[-1] + c)
    err, shards = None, []
    try:
        for s, feats in mine.items():
            for f in feats:
                f["unique_id"] = first[f["example_index"]] + f["doc_span_index"]
            name = shard_name(s, num_shards)
            n = write_examples(tmp / name, (_record(f, is_training) for f in feats))
            shards.append({"file": name, "records": n})
            log(f"{rank_tag(rank)}{name}: {n} features")
    except OSError as e:
        err = f"cannot write shards to {out}: {e.strerror}"
    agree(comm, err)
    side = [{k: f[k] for k in ("unique_id", "example_index", "doc_span_index", "tokens", "token_to_orig_map",
                               "token_is_max_context")} for feats in mine.values() for f in feats]
    if comm is not None:
        gathered = comm.gather((shards, side), root=0)
        shards = [s for part in (gathered or []) for s in part[0]]
        side = [f for part in (gathered or []) for f in part[1]]
    if rank != 0:
        return None
    from hvd_bert.files import atomic_write

    side.sort(key=lambda f: f["unique_id"])
    atomic_write(tmp / "features.jsonl", lambda t: t.write_text(
        "".join(json.dumps(f, sort_keys=True) + "\n" for f in side)))
    atomic_write(tmp / "examples.jsonl", lambda t: t.write_text("".join(json.dumps(
        {"qas_id": e.qas_id, "doc_tokens": e.doc_tokens, "answers": e.answers}) + "\n" for e in examples)))
    shards.sort(key=lambda s: s["file"])
    meta = {"kind": KIND_SQUAD, "format": 1, "vocab_file": "vocab.txt",
            "vocab_sha256": file_sha256(tmp / "vocab.txt"), "vocab_size": tok.get_vocab_size(),
            "do_lower_case": do_lower_case, "version_2_with_negative": version_2, "is_training": is_training,
            "max_seq_length": max_seq_length, "doc_stride": doc_stride,
            "max_query_length": max_query_length, "num_shards": num_shards, "shards": shards,
            "examples": len(examples), "skipped_examples": skipped, "total_records": sum(counts),
            "source": src.name, "source_version": data.get("version")}
    write_sidecar(tmp, meta)
    commit_folder(tmp, out)
    return meta


def read_side_files(folder: str | Path, meta: dict) -> tuple[list[dict], list[dict]]:
    """A prepared SQuAD folder's ``features.jsonl`` and ``examples.jsonl`` (what prediction maps
    answers back with), every field the mapping uses checked against the folder's sidecar and
    each other: ``(examples, features)``, or a DatasetError naming the file and what is wrong."""
    folder = Path(folder)

    def rows(name: str) -> list[dict]:
        path = folder / name
        try:
            out = [json.loads(line) for line in path.read_bytes().decode("utf-8").splitlines()]
        except (OSError, ValueError, RecursionError) as e:
            raise DatasetError(f"{path} cannot be read ({type(e).__name__}: {e}); prepare the data again "
                               f"(hvd-bert prepare-squad)") from None
        if not all(isinstance(r, dict) for r in out):
            raise DatasetError(f"{path} is damaged (a line that is not an object); prepare the data again")
        return out

    examples, features = rows("examples.jsonl"), rows("features.jsonl")

    def bad(name: str, what: str) -> DatasetError:
        return DatasetError(f"{folder / name} is damaged ({what}); prepare the data again (hvd-bert "
                            f"prepare-squad)")

    def count(v, below: int) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < below
    ids = set()
    for i, ex in enumerate(examples):
        if not isinstance(ex.get("qas_id"), (str, int)) or isinstance(ex.get("qas_id"), bool) \
                or str(ex["qas_id"]) in ids:
            raise bad("examples.jsonl", f"example {i}'s qas_id {ex.get('qas_id')!r} is missing or repeated")
        ids.add(str(ex["qas_id"]))
        if not isinstance(ex.get("doc_tokens"), list) or not ex["doc_tokens"] \
                or not all(isinstance(t, str) for t in ex["doc_tokens"]):
            raise bad("examples.jsonl", f"example {i}'s doc_tokens are not a list of words")
    n = meta.get("total_records")
    if len(features) != n or (meta.get("examples") is not None and len(examples) != meta["examples"]):
        raise bad("features.jsonl", f"{len(features)} features and {len(examples)} examples, where "
                                    f"dataset.json says {n} and {meta.get('examples')}")
    seen = set()
    for i, f in enumerate(features):
        uid, ei = f.get("unique_id"), f.get("example_index")
        if not isinstance(uid, int) or not count(uid - FIRST_UNIQUE_ID, n) or uid in seen:
            raise bad("features.jsonl", f"feature {i}'s unique_id {uid!r} is not one of the {n} records once")
        seen.add(uid)
        if not count(ei, len(examples)) or not count(f.get("doc_span_index"), 1 << 20):
            raise bad("features.jsonl", f"feature {i}'s example_index {ei!r} or doc_span_index is out of "
                                        f"range")
        tokens, words = f.get("tokens"), len(examples[ei]["doc_tokens"])
        maps = (f.get("token_to_orig_map"), f.get("token_is_max_context"))
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens) \
                or not all(isinstance(m, dict) for m in maps):
            raise bad("features.jsonl", f"feature {i} has no tokens and token maps")
        for k, v in maps[0].items():
            if not (k.isdigit() and int(k) < len(tokens) and count(v, words)):
                raise bad("features.jsonl", f"feature {i} maps token {k!r} to word {v!r} of {words}")
        if not all(k.isdigit() and isinstance(v, bool) for k, v in maps[1].items()):
            raise bad("features.jsonl", f"feature {i}'s token_is_max_context is not token -> true/false")
    return examples, features
