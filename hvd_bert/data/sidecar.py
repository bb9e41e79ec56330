"""A prepared data folder's ``dataset.json``: what the folder holds (its ``kind``, settings,
vocabulary hash, shards with their record counts and sizes), written last and atomically, and
checked by every reader before it reads a record."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

from hvd_bert.data.records import DatasetError
from hvd_bert.files import atomic_write

__all__ = ["SIDECAR", "write_sidecar", "read_sidecar", "label_fault", "file_sha256", "shard_count_error",
           "sidecar_digest", "SidecarWatch"]

SIDECAR = "dataset.json"
# the command that prepares each kind (named in the errors of a reader that finds none)
PREPARED_BY = {"bert-pretraining": "prepare-bert", "bert-classification": "prepare-classification",
               "bert-squad": "prepare-squad", "ncf": "prepare-ncf",
               "bert-token-classification": "prepare-token-classification"}


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sidecar_digest(folder: str | Path) -> str | None:
    """What identifies a prepared folder's data (its path does not: data can be prepared again at
    the same path): the SHA-256 of its ``dataset.json``, which lists every shard's records and
    bytes and the vocabulary's hash; None when there is none."""
    try:
        return hashlib.sha256((Path(folder).expanduser() / SIDECAR).read_bytes()).hexdigest()
    except OSError:
        return None


class SidecarWatch:
    """Notices a data folder prepared again under a running job: ``check()`` (cheap: one
    ``stat``) raises a DatasetError once the folder's ``dataset.json`` is gone or holds other
    content than when the job started reading it."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.digest = sidecar_digest(self.folder)
        self.seen = self._stat()

    def _stat(self):
        try:
            st = (self.folder / SIDECAR).stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def check(self) -> None:
        now = self._stat()
        if now == self.seen:
            return
        if now is not None and sidecar_digest(self.folder) == self.digest:
            self.seen = now
            return
        raise DatasetError(f"{self.folder / SIDECAR} changed while this job was reading {self.folder} (the "
                           f"data was prepared again under it): the batches would mix two data sets. Stop, "
                           f"then start a new run (another train.output_dir) on the new data, or restore the "
                           f"old data to resume")


def write_sidecar(folder: str | Path, meta: dict) -> Path:
    """Write ``folder/dataset.json`` atomically (written last: its presence marks the data
    complete)."""
    folder = Path(folder)
    for shard in meta.get("shards", []):  # each shard's size, checked by every reader
        if isinstance(shard, dict) and "file" in shard and (folder / shard["file"]).is_file():
            shard["bytes"] = (folder / shard["file"]).stat().st_size
    return atomic_write(folder / SIDECAR,
                        lambda tmp: tmp.write_text(json.dumps(meta, indent=1, sort_keys=True)))


# fields every reader uses, with their types (bool is not an int here)
_INT_FIELDS = ("total_records", "max_seq_length", "max_predictions_per_seq", "vocab_size", "num_shards",
               "examples", "doc_stride", "max_query_length", "num_labels", "users", "items")


def _check_fields(meta, side: Path) -> None:
    """The sidecar's structure before any field is used: a wrong type or range is one line."""
    def bad(what: str) -> DatasetError:
        return DatasetError(f"{side} is damaged: {what}; prepare the data again")

    def count(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not isinstance(meta, dict):
        raise bad(f"a JSON {type(meta).__name__}, not an object")
    shards = meta.get("shards")
    if not isinstance(shards, list):
        raise bad(f"'shards' is {type(shards).__name__}, not a list")
    for i, s in enumerate(shards):
        if not (isinstance(s, dict) and isinstance(s.get("file"), str) and count(s.get("records"))):
            raise bad(f"shard {i} is not {{'file': NAME, 'records': COUNT}}")
        name = s["file"]
        if not name or name != Path(name).name or name in (".", ".."):
            raise bad(f"shard {i}'s file {name!r} is not a file name in the folder")
        if "bytes" in s and not count(s["bytes"]):
            raise bad(f"shard {i}'s 'bytes' is {s['bytes']!r}")
    for key in _INT_FIELDS:
        if key in meta and meta[key] is not None and not count(meta[key]):
            raise bad(f"{key!r} is {meta[key]!r}, not a count")
    from hvd_bert.data.kinds import KIND_SQUAD

    if meta.get("kind") == KIND_SQUAD and not isinstance(meta.get("is_training"), bool):
        raise bad(f"is_training is {meta.get('is_training')!r}, not true or false (SQuAD features say which "
                  f"split they are)")
    if meta.get("labels") not in (None, []):  # (a classifier's outputs in order, one name each)
        fault = label_fault(meta["labels"])
        if fault:
            raise bad(fault)
    if "total_records" in meta and meta["total_records"] != sum(s["records"] for s in shards) \
            and meta.get("kind") != "ncf":
        raise bad(f"total_records {meta['total_records']} is not the sum of the shards' records")


def read_sidecar(folder: str | Path, kind: str | tuple[str, ...],
                 expect: Mapping[str, Any] | None = None) -> dict:
    """Read and check a dataset folder: the sidecar exists and is of ``kind`` (or one of the
    kinds), every shard it lists exists, and each ``expect`` setting matches (e.g.
    ``max_seq_length``)."""
    folder = Path(folder)
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    how = " or ".join(f"hvd-bert {PREPARED_BY.get(k, 'prepare-...')}" for k in kinds)
    if folder.exists() and not folder.is_dir():  # (a TSV, a JSON or a CoNLL file: the input of a preparation)
        raise DatasetError(f"data {folder} is a file, not a prepared data folder: prepare it first ({how}, "
                           f"with this file as its input) and give the folder it writes")
    if not folder.is_dir():
        raise DatasetError(f"data folder {folder} does not exist; prepare it first ({how}) or pass the "
                           f"right path")
    side = folder / SIDECAR
    if not side.is_file():
        raise DatasetError(f"{folder} has no {SIDECAR}: the data is incomplete (preparation was "
                           f"interrupted?) or not prepared by hvd_bert; prepare it again ({how})")
    try:
        meta = json.loads(side.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise DatasetError(f"{side} is not valid JSON ({e}); prepare the data again") from None
    _check_fields(meta, side)
    if meta.get("kind") not in kinds:
        raise DatasetError(f"{folder} holds {meta.get('kind')!r} data, expected "
                           f"{' or '.join(map(repr, kinds))}: give a folder of that kind ({how})")
    for shard in meta.get("shards", []):
        path = folder / shard["file"]
        if not path.is_file():
            raise DatasetError(f"{path} is listed in {SIDECAR} but missing; prepare the data again")
        if "bytes" in shard and path.stat().st_size != shard["bytes"]:
            raise DatasetError(f"{path} is {path.stat().st_size} bytes but {SIDECAR} says {shard['bytes']}: "
                               f"the file was cut short or changed after preparation; prepare the data again")
    if not meta.get("shards"):
        raise DatasetError(f"{folder} has no shards; the input was empty?")
    for key, want in (expect or {}).items():
        if key in meta and meta[key] != want:
            raise DatasetError(
                f"{folder} was prepared with {key}={meta[key]!r} but {want!r} is expected; prepare "
                f"the data again with {key}={want!r} or change the setting to {meta[key]!r}")
    return meta


def shard_count_error(folder: str | Path, meta: dict) -> str | None:
    """The first shard whose record count is not the one the sidecar records, as a message;
    None if all agree (a scan of every record header: for an error path)."""
    from hvd_bert.data.records import count_message, iter_records

    for shard in meta["shards"]:
        actual = sum(1 for _ in iter_records(Path(folder) / shard["file"], verify=False))
        if actual != shard["records"]:
            return count_message(folder, shard["file"], actual, shard["records"])
    return None


def label_fault(names) -> str | None:
    """Why ``names`` is not a label map (a list of distinct, non-empty names, the classifier's
    outputs in order): one name twice would give two outputs one name and collapse their scores."""
    if not isinstance(names, list) or not names or not all(isinstance(x, str) and x.strip() for x in names):
        return f"labels {names!r} is not a list of names"
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if not name.isprintable():
            return f"the label {name!r} holds characters that do not print (controls, direction marks)"
        if name != name.strip():
            return f"the label {name!r} has spaces around it (a label is its name alone)"
        if name in seen:
            return f"the label {name!r} names outputs {seen[name]} and {i}: a label map is one-to-one"
        seen[name] = i
    return None
