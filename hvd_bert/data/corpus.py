"""The built-in default corpus: the docstrings of the Python standard library.

Every machine that runs hvd_bert has this text, so the main job needs no input and no
download. Each standard-library module is one document; its module, class and function
docstrings are split into sentences, one per line (Google BERT's input format). The
modules are read with ``ast`` (nothing is imported). The result depends on the Python
version only.
"""

from __future__ import annotations

import ast
import re
import sysconfig
from pathlib import Path

from hvd_bert.files import atomic_write

__all__ = ["stdlib_documents", "write_stdlib_corpus"]

_SKIP_DIRS = {"test", "tests", "idlelib", "tkinter", "turtledemo", "site-packages", "lib2to3",
              "ensurepip", "__pycache__", "pydoc_data", "encodings"}
_SENT = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")


def _sentences(doc: str) -> list[str]:
    out = []
    for para in re.split(r"\n\s*\n", doc):
        if re.search(r"^\s*(>>>|\$ |[-=]{3,})", para, re.M):
            continue  # examples, tables and rules are not prose
        text = " ".join(para.split())
        for s in _SENT.split(text):
            if len(s.split()) >= 4:
                out.append(s)
    return out


def stdlib_documents(max_bytes: int = 3_000_000) -> list[list[str]]:
    """One document (list of sentences) per standard-library module, in path order, up to
    about ``max_bytes`` of text."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if not (set(p.relative_to(root).parts[:-1]) & _SKIP_DIRS))
    docs, size = [], 0
    for f in files:
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"), filename=str(f))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        sents = []
        for node in [tree, *ast.walk(tree)]:
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                d = ast.get_docstring(node)
                if d:
                    sents.extend(_sentences(d))
        sents = list(dict.fromkeys(sents))  # repeated docstrings once
        if len(sents) >= 2:
            docs.append(sents)
            size += sum(len(s) + 1 for s in sents)
            if size >= max_bytes:
                break
    return docs


def write_stdlib_corpus(path: str | Path, max_bytes: int = 3_000_000) -> Path:
    """Write the corpus to ``path`` (atomically) unless it is there already."""
    path = Path(path)
    if not path.is_file():
        docs = stdlib_documents(max_bytes)
        atomic_write(path, lambda t: t.write_text("\n\n".join("\n".join(d) for d in docs) + "\n",
                                                  encoding="utf-8"))
    return path
