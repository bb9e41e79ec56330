"""The tokenizer that goes with a checkpoint: ``--vocab`` may be a ``vocab.txt``, a Hugging Face
``tokenizer.json`` (WordPiece), or a checkpoint folder (Hugging Face or Google) holding one;
lower-casing comes from the checkpoint (``tokenizer_config.json``'s ``do_lower_case``, the
``tokenizer.json`` normalizer, or Google's ``uncased_`` / ``cased_`` folder naming) unless the
command line says otherwise. A vocabulary without BERT's special tokens, or of another size
than the checkpoint's ``config.json`` / ``bert_config.json`` says, is an error naming both."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from hvd_bert.data.records import DatasetError
from hvd_bert.files import read_json_object

__all__ = ["ResolvedVocab", "resolve_vocab", "SPECIAL_TOKENS", "vocab_tokens",
           "train_vocab", "load_tokenizer", "encode_ids", "vocab_and_case"]

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@dataclass(frozen=True)
class ResolvedVocab:
    path: Path                    # a vocab.txt (written next to nothing the user owns)
    do_lower_case: bool | None    # what the checkpoint says; None: it does not say
    source: str                   # where it came from, for messages


def _from_tokenizer_json(path: Path) -> tuple[Path, bool | None]:
    try:
        tok = json.loads(path.read_bytes().decode("utf-8"))
        model = tok["model"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise DatasetError(f"{path} is not a readable tokenizer.json ({type(e).__name__}: {e})") from None
    if not isinstance(model, dict):
        raise DatasetError(f"{path}'s model is a JSON {type(model).__name__}, not an object: the file is "
                           f"damaged; give the checkpoint's tokenizer.json or vocab.txt")
    if model.get("type") != "WordPiece":
        raise DatasetError(f"{path} holds a {model.get('type')!r} tokenizer; BERT needs WordPiece")
    vocab = model.get("vocab")  # token -> id
    if not isinstance(vocab, dict) or not all(isinstance(i, int) and not isinstance(i, bool)
                                              for i in vocab.values()):
        raise DatasetError(f"{path}'s WordPiece model has no vocab of token -> id: the file is damaged; "
                           f"give the checkpoint's tokenizer.json or vocab.txt")
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        raise DatasetError(f"{path}: the WordPiece ids are not 0..{len(ids) - 1}")
    tmp = tempfile.mkdtemp(prefix="hvd_bert-vocab-")  # read in this process only (the data
    atexit.register(shutil.rmtree, tmp, True)         # folder gets its own copy): gone at exit
    out = Path(tmp) / "vocab.txt"
    ordered = sorted(vocab.items(), key=lambda kv: kv[1])
    out.write_text("".join(t + "\n" for t, _ in ordered), encoding="utf-8")
    norm = tok.get("normalizer") or {}
    lower = norm.get("lowercase") if norm.get("type") == "BertNormalizer" else None
    return out, lower


def _lower_of_folder(folder: Path) -> bool | None:
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        try:
            value = read_json_object(cfg).get("do_lower_case")
            if isinstance(value, bool):
                return value
        except (OSError, ValueError):
            pass
    name = folder.name.lower()
    if name.startswith("uncased_") or "-uncased" in name:
        return True
    if name.startswith("cased_") or "-cased" in name:
        return False
    return None


def _checkpoint_vocab_size(folder: Path) -> tuple[int, str] | None:
    for name in ("config.json", "bert_config.json"):
        p = folder / name
        if p.is_file():
            try:
                return int(read_json_object(p)["vocab_size"]), str(p)
            except (OSError, ValueError, KeyError, TypeError):
                return None
    return None


def resolve_vocab(arg: str | Path) -> ResolvedVocab:
    p = Path(arg).expanduser()
    lower, folder = None, None
    if p.is_dir():
        folder = p
        if (p / "vocab.txt").is_file():
            path = p / "vocab.txt"
        elif (p / "tokenizer.json").is_file():
            path, lower = _from_tokenizer_json(p / "tokenizer.json")
        else:
            raise DatasetError(f"{p} has no vocab.txt or tokenizer.json; give the checkpoint's vocab file "
                               f"with --vocab")
        lower = _lower_of_folder(p) if _lower_of_folder(p) is not None else lower
    elif p.name.endswith(".json"):
        path, lower = _from_tokenizer_json(p)
        folder = p.parent
        lower = lower if lower is not None else _lower_of_folder(p.parent)
    elif p.is_file():
        path = p
        lower = _lower_of_folder(p.parent)
        folder = p.parent
    else:
        raise DatasetError(f"vocab {p} does not exist; give a vocab.txt, a tokenizer.json or a checkpoint "
                           f"folder")
    tokens = vocab_tokens(path)
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise DatasetError(f"{path} lacks BERT's special tokens {missing}; it is not a BERT WordPiece "
                           f"vocabulary")
    size = _checkpoint_vocab_size(folder) if folder is not None else None
    if size is not None and size[0] != len(tokens):
        raise DatasetError(f"{path} has {len(tokens)} tokens but {size[1]} says vocab_size {size[0]}: the "
                           f"vocabulary does not belong to this checkpoint; give the checkpoint's own")
    return ResolvedVocab(path, lower, str(p))


def checkpoint_vocab_sha256(init: str) -> tuple[str, str] | None:
    """``(sha256, vocab file)`` of the vocabulary a checkpoint was trained with, where it can be
    known: a published folder's ``vocab.txt``, or a run folder's data (its config.json names the
    data, whose sidecar records the vocab's hash); None otherwise (a .npz, say)."""
    from hvd_bert.data.sidecar import file_sha256

    p = Path(init).expanduser()
    folder = p if p.is_dir() and not p.name.startswith("ckpt-") else p.parent
    if (folder / "vocab.txt").is_file():
        return file_sha256(folder / "vocab.txt"), str(folder / "vocab.txt")
    try:
        data = read_json_object(folder / "config.json").get("data")
        side = read_json_object(Path(data) / "dataset.json") if isinstance(data, str) and data else None
    except (OSError, ValueError):
        return None
    if side and isinstance(side.get("vocab_sha256"), str):
        return side["vocab_sha256"], str(Path(data) / side.get("vocab_file", "vocab.txt"))
    return None


def init_vocab_error(init: str, ckpt_vocab_size: int, data: str, meta: dict, prepare: str) -> str | None:
    """Why the data in ``data`` (sidecar ``meta``) cannot be trained from checkpoint ``init``
    (whose embeddings have ``ckpt_vocab_size`` rows): another vocabulary size, or, where the
    checkpoint's vocabulary is known, another vocabulary of the same size; None if none is
    seen. ``prepare`` names the command that prepares the data again."""
    if ckpt_vocab_size != meta["vocab_size"]:
        return (f"init_checkpoint {init} has a vocabulary of {ckpt_vocab_size} tokens, the data {data} "
                f"{meta['vocab_size']}: prepare the data with the checkpoint's vocabulary "
                f"(hvd-bert {prepare} --vocab ...{' or --like ' + init if prepare == 'prepare-bert' else ''}"
                f")")
    known = checkpoint_vocab_sha256(init)
    if known is not None and meta.get("vocab_sha256") not in (None, known[0]):
        return (f"{data} was prepared with another vocabulary of the same size than init_checkpoint "
                f"{init} ({known[1]}): the token ids would mean other words; prepare it again with "
                f"--vocab {known[1]}")
    return None


def train_vocab(files: Sequence[str | Path], out_dir: str | Path, vocab_size: int = 8192,
                do_lower_case: bool = True, sentences: Iterable[str] | None = None) -> Path:
    """Train a WordPiece vocabulary with ``tokenizers`` on text files, or on ``sentences`` when
    given; writes ``vocab.txt``."""
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(lowercase=do_lower_case, strip_accents=do_lower_case)
    if sentences is not None:
        tok.train_from_iterator(sentences, vocab_size=vocab_size, min_frequency=2,
                                special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    else:
        tok.train([str(f) for f in files], vocab_size=vocab_size, min_frequency=2,
                  special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_model(str(out))
    return out / "vocab.txt"


def vocab_tokens(path: Path) -> list[str]:
    """A vocab.txt's tokens, one per line: UTF-8, each token once (the tokenizer would keep one of
    two: the ids and the size would not be the file's)."""
    try:
        tokens = path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise DatasetError(f"vocab file {path} is not UTF-8 ({e.reason} at byte {e.start}); give the "
                           f"checkpoint's vocab.txt") from None
    first: dict[str, int] = {}
    for n, token in enumerate(tokens, 1):
        if token in first:
            raise DatasetError(f"vocab file {path} has the token {token!r} twice (lines {first[token]} and "
                               f"{n}): a vocabulary lists each token once; give the checkpoint's own "
                               f"vocab.txt")
        first[token] = n
    return tokens


def load_tokenizer(vocab_file: str | Path, do_lower_case: bool = True):
    """A ``tokenizers`` WordPiece tokenizer for ``vocab_file`` (which must hold BERT's special
    tokens)."""
    from tokenizers import BertWordPieceTokenizer

    p = Path(vocab_file)
    if not p.is_file():
        raise DatasetError(f"vocab file {p} does not exist; pass an existing vocab.txt or leave it "
                           f"out to train one on the input")
    vocab = vocab_tokens(p)
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise DatasetError(f"vocab file {p} lacks the special tokens {missing}; it is not a BERT vocab")
    return BertWordPieceTokenizer(str(p), lowercase=do_lower_case, strip_accents=do_lower_case)


def encode_ids(tok, texts: list[str]) -> list[list[int]]:
    """The token ids of ``texts`` (no special tokens) by a :func:`load_tokenizer` tokenizer, in one
    batch, without the character offsets when the ``tokenizers`` version can skip them."""
    inner = tok._tokenizer  # the Rust Tokenizer the wrapper holds (its own batch call keeps offsets)
    fast = getattr(inner, "encode_batch_fast", inner.encode_batch)
    return [e.ids for e in fast(texts, add_special_tokens=False)]


def vocab_and_case(vocab: str | None, cased: bool = False, uncased: bool = False, say=print):
    """``(vocab.txt or None, do_lower_case)`` of a preparation command: ``vocab`` resolved (a
    vocab.txt, a tokenizer.json or a checkpoint folder), and the case from ``cased`` /
    ``uncased``, else the checkpoint's (said with ``say``), else lower-case."""
    resolved = resolve_vocab(vocab) if vocab else None
    if cased or uncased:
        lower = not cased
    elif resolved is not None and resolved.do_lower_case is not None:
        lower = resolved.do_lower_case
        say(f"{'lower-casing' if lower else 'keeping case'}, as the checkpoint of {resolved.source} does "
            f"(--cased / --uncased to change)")
    else:
        lower = True
    return (resolved.path if resolved else None), lower

