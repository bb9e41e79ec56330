"""An easy generated NER task in CoNLL-2003's published layout (``word POS chunk NER``): the
entity words are whole words of the test vocabulary, one or two words an entity (IOB2), the
first from its type's first words and the second from its second words, among filler words; a
tiny BERT from scratch learns it in a few hundred steps. Deterministic for a seed."""

from pathlib import Path

import numpy as np

TYPES = {"PER": ["path", "nodes", "custom", "match", "test", "child", "address", "debug"],
         "LOC": ["generator", "signals", "keyword", "output", "message", "manager", "sequence", "reader"],
         "ORG": ["barrier", "coefficient", "example", "length", "count", "override", "exceptions",
                 "functions"]}
# (a type's first words are its list's even ones, its second words the odd ones)
FILLER = ["the", "is", "in", "to", "of", "return", "useful", "lines", "uses", "lost", "whenever", "different",
          "attributes", "unless", "less", "another", "try", "proper", "specific", "multiple", "necessary"]
LABELS = ["B-LOC", "B-ORG", "B-PER", "I-LOC", "I-ORG", "I-PER", "O"]


def sentences(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        words, tags = [], []
        for _ in range(int(rng.integers(2, 5))):
            for _ in range(int(rng.integers(1, 4))):
                words.append(str(rng.choice(FILLER)))
                tags.append("O")
            kind = str(rng.choice(sorted(TYPES)))
            for j in range(int(rng.integers(1, 3))):
                words.append(str(rng.choice(TYPES[kind][j::2])))
                tags.append(("B-" if j == 0 else "I-") + kind)
        out.append((words, tags))
    return out


def write(path: Path, n: int, seed: int, docstart: bool = True) -> Path:
    """``n`` sentences as CoNLL-2003 writes them (with its ``-DOCSTART-`` line)."""
    lines = ["-DOCSTART- -X- -X- O", ""] if docstart else []
    for words, tags in sentences(n, seed):
        lines += [f"{w} NN I-NP {t}" for w, t in zip(words, tags)] + [""]
    path.write_text("\n".join(lines) + "\n")
    return path
