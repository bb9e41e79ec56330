"""Sentence splitters compared for prose and one-document-per-line input (``prepare-bert``):
quality on the English Golden Rules (pragmatic_segmenter's 41 hard cases: abbreviations,
initials, numbers, lists, quotes, ellipses, each a sentence or two on its own), on 16
abbreviations in running text (a title or abbreviation right after a sentence end, as in
encyclopedic prose: "... coercion. Dr. Smith wrote ..."), and on real prose with gold sentences
(Google BERT's ``sample_text.txt``, Project Gutenberg, one sentence a line; its lines that
Google's file joined with ';' were joined here too), and speed in characters/s on that prose.

    .venv/bin/python benchmarks/sentence_splitters.py [--repeat 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

DATA = Path(__file__).parent / "data"


def splitters() -> dict:
    import blingfire
    import pysbd
    from syntok import segmenter

    seg = pysbd.Segmenter(language="en", clean=False)

    def syntok_split(text):
        return ["".join(t.spacing + t.value for t in s).strip()
                for p in segmenter.process(text) for s in p]

    return {"pysbd 0.3.4": lambda t: [s.strip() for s in seg.segment(t) if s.strip()],
            "syntok 1.4.4": syntok_split,
            "blingfire 0.1.8": lambda t: [s for s in blingfire.text_to_sentences(t).split("\n") if s]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200, help="copies of the prose timed")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    golden = json.loads((DATA / "golden_rules_en.json").read_text(encoding="utf-8"))
    abbrev = json.loads((DATA / "abbreviations_en.json").read_text(encoding="utf-8"))
    prose = (DATA / "sample_text.txt").read_text(encoding="utf-8").strip()
    docs = [d.split("\n") for d in prose.split("\n\n")]
    gold = [s for d in docs for s in d]
    rows = []
    for name, split in splitters().items():
        ok = sum(split(text) == want for text, want in golden)
        ab = sum(split(text) == want for text, want in abbrev)
        got = [s for d in docs for s in split(" ".join(d))]
        found = len(set(got) & set(gold))
        para = "\n\n".join(" ".join(d) for d in docs) + "\n\n"
        text = para * a.repeat
        split(para)  # warm
        t0 = time.perf_counter()
        for p in text.split("\n\n"):
            if p:
                split(p)
        dt = time.perf_counter() - t0
        rows.append({"splitter": name, "golden_rules": f"{ok}/{len(golden)}",
                     "abbreviations_in_text": f"{ab}/{len(abbrev)}",
                     "prose_sentences": f"{found}/{len(gold)}", "prose_output": len(got),
                     "mchars_per_s": round(len(text) / dt / 1e6, 3)})
        print(f"{name:16s} golden rules {ok:2d}/{len(golden)}  in-text abbreviations {ab:2d}/{len(abbrev)}  "
              f"prose: {found}/{len(gold)} gold sentences "
              f"exactly ({len(got)} output)  {len(text) / dt / 1e6:.3f} M chars/s")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
