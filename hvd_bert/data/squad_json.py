"""SQuAD's JSON files, read and checked against SQuAD's structure wherever they are read
(``prepare-squad``, ``predict``, ``evaluate-squad``): one line naming the first place that
differs and the shape to give."""

from __future__ import annotations

import json
from pathlib import Path

from hvd_bert.data.records import DatasetError

__all__ = ["squad_error", "read_squad_json", "read_json", "MAX_CONTEXT_CHARS", "has_text"]

MAX_CONTEXT_CHARS = 1 << 20  # a SQuAD context or question, in characters (docs/data.md "Limits")
_SHAPE = ("give a SQuAD v1.1 or v2.0 file: {\"data\": [{\"paragraphs\": [{\"context\": TEXT, \"qas\": "
          "[{\"id\": ID, \"question\": TEXT, \"answers\": [{\"text\": TEXT, \"answer_start\": N}]}]}]}]}")


def _kind(x) -> str:
    return "missing" if x is None else {str: "a string", list: "a list", dict: "an object", bool: "a boolean",
                                        int: "a number", float: "a number"}.get(type(x), type(x).__name__)


def squad_error(data, source: str) -> str | None:
    """Where a parsed SQuAD file departs from SQuAD's structure, as one line naming the place
    (``data[0].paragraphs[2].qas``) and the shape to give; None when it has that structure."""
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        return f"{source} is not a SQuAD file (no 'data' list of articles); {_SHAPE}"

    def wrong(where: str, got, want: str) -> str:
        return f"{source}: {where} is {_kind(got)}, not {want}; {_SHAPE}"
    v2 = str(data.get("version", "")).lstrip("v").startswith("2")
    ids: dict[str, str] = {}
    answered = unanswered = None  # (a v1.1 file: every question answered, a set to score, or none)
    for i, art in enumerate(data["data"]):
        paras = art.get("paragraphs") if isinstance(art, dict) else None
        if not isinstance(art, dict):
            return wrong(f"data[{i}]", art, "an article object")
        if not isinstance(paras, list):
            return wrong(f"data[{i}].paragraphs", paras, "a list of paragraphs")
        for j, par in enumerate(paras):
            w = f"data[{i}].paragraphs[{j}]"
            if not isinstance(par, dict):
                return wrong(w, par, "an object with a context and its qas")
            if not isinstance(par.get("context"), str):
                return wrong(f"{w}.context", par.get("context"), "a string")
            if not has_text(par["context"]):  # (an answer would be Google's placeholder "empty")
                return (f"{source}: {w}.context has no text (empty, or spaces and invisible characters): a "
                        f"question needs a paragraph to answer from; give its text or drop it")
            if len(par["context"]) > MAX_CONTEXT_CHARS:
                return (f"{source}: {w}.context holds {len(par['context']):,} characters, over the limit of "
                        f"{MAX_CONTEXT_CHARS:,}; split it into paragraphs")
            if not isinstance(par.get("qas"), list):
                return wrong(f"{w}.qas", par.get("qas"), "a list of questions")
            for k, qa in enumerate(par["qas"]):
                q = f"{w}.qas[{k}]"
                if not isinstance(qa, dict):
                    return wrong(q, qa, "a question object")
                if not isinstance(qa.get("id"), (str, int)) or isinstance(qa.get("id"), bool):
                    return wrong(f"{q}.id", qa.get("id"), "a string")
                if str(qa["id"]) in ids:  # (7 and "7" are one key of a predictions file)
                    return (f"{source}: question id {qa['id']!r} is given twice ({ids[str(qa['id'])]} and "
                            f"{q}); every question needs its own id")
                ids[str(qa["id"])] = q
                if "is_impossible" in qa and not isinstance(qa["is_impossible"], bool):
                    return wrong(f"{q}.is_impossible", qa["is_impossible"], "true or false")
                if not isinstance(qa.get("question"), str) or len(qa["question"]) > MAX_CONTEXT_CHARS \
                        or not has_text(qa["question"]):
                    return wrong(f"{q}.question", qa.get("question"), "a string with text (of at most "
                                 f"{MAX_CONTEXT_CHARS:,} characters)")
                answers = qa.get("answers", [])
                if not isinstance(answers, list):
                    return wrong(f"{q}.answers", answers, "a list of answers")
                for n, a in enumerate(answers):
                    if not isinstance(a, dict):
                        return wrong(f"{q}.answers[{n}]", a, "an answer object")
                    if not isinstance(a.get("text"), str):
                        return wrong(f"{q}.answers[{n}].text", a.get("text"), "a string")
                    if not a["text"].strip():
                        return (f"{source}: {q}.answers[{n}].text is empty; give the answer's words as in "
                                f"the context")
                    start = a.get("answer_start", 0)
                    if not isinstance(start, int) or isinstance(start, bool):
                        return wrong(f"{q}.answers[{n}].answer_start", start,
                                     "a whole number (a character offset)")
                if not v2 and not answers:
                    unanswered = unanswered or q
                elif not v2:
                    answered = answered or q
                if answered and unanswered:
                    return (f"{source}: {unanswered} has no answers while {answered} has: a SQuAD v1.1 set "
                            f"to train or score on answers every question; give its answers, or mark the "
                            f"file version 2.0 and the question is_impossible")
    return None


def read_squad_json(path: str | Path, what: str = "SQuAD file"):
    """A SQuAD file, parsed and checked (``squad_error``): a DatasetError naming what is wrong."""
    data = read_json(path, what)
    error = squad_error(data, str(path))
    if error:
        raise DatasetError(error)
    return data


def read_json(path: str | Path, what: str):
    p = Path(path)
    if p.exists() and not p.is_file() and not p.is_dir():  # (a pipe would block, a device never ends)
        raise DatasetError(f"{what} {p} is not a regular file (a pipe, a device or a socket): give the file "
                           f"itself")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DatasetError(f"{what} {p} does not exist: check the path") from None
    except IsADirectoryError:
        raise DatasetError(f"{what} {p} is a folder: give the file itself") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        hint = (": give SQuAD's .json file, or .jsonl lines of question and context (a table of texts is for "
                "a classification model)" if what.startswith("SQuAD") else "")
        raise DatasetError(f"{what} {p} is not a JSON file ({e}){hint}") from None


def has_text(s: str) -> bool:
    """Whether ``s`` holds a character that prints (not only spaces, controls and zero-width marks)."""
    import unicodedata

    return any(not ch.isspace() and unicodedata.category(ch) not in ("Cc", "Cf", "Zs", "Zl", "Zp")
               for ch in s)
