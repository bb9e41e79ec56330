"""A small generated SQuAD task that a tiny BERT learns from scratch: the answer is the word
after "answer is" somewhere in a context of filler words (often longer than one window, so
questions have several features). Written as SQuAD v1.1 or v2.0 JSON (v2.0: some questions
have no "answer is" in their context and are impossible)."""

import json
import random

FILLER = ("the file list value name object function return string default data class method module "
          "path time type new read write").split()
ANSWERS = ("red green blue black white yellow orange purple").split()


def squad_json(n: int, seed: int, *, version_2: bool = False, words=(20, 70)) -> dict:
    rng = random.Random(seed)
    articles = []
    for q in range(n):
        ctx = rng.choices(FILLER, k=rng.randint(*words))
        impossible = version_2 and rng.random() < 0.3
        answers = []
        if not impossible:
            at = rng.randint(0, len(ctx))
            word = rng.choice(ANSWERS)
            ctx[at:at] = ["answer", "is", f"{word}."]
            text = " ".join(ctx)
            start = len(" ".join(ctx[:at + 2])) + 1
            answers = [{"text": word, "answer_start": start}]
            assert text[start:start + len(word)] == word
        qa = {"id": f"q{seed}-{q}", "question": "what is the answer?", "answers": answers}
        if version_2:
            qa["is_impossible"] = impossible
        articles.append({"title": f"t{q}", "paragraphs": [{"context": " ".join(ctx), "qas": [qa]}]})
    return {"version": "v2.0" if version_2 else "1.1", "data": articles}


def write(path, n, seed, **kw):
    path.write_text(json.dumps(squad_json(n, seed, **kw)))
    return path


def stsb_tsv(path, n, seed):
    """STS-B's published layout (a header; the sentences in columns 8 and 9, the score last),
    with a score a tiny BERT can learn: how many of the first sentence's words are "good"."""
    rng = random.Random(seed)
    rows = ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"]
    for i in range(n):
        good = rng.randint(0, 5)
        s1 = rng.choices(FILLER, k=8 - good) + ["good"] * good
        rng.shuffle(s1)
        s2 = rng.choices(FILLER, k=6)
        rows.append(f"{i}\tmain\tf\t2012\t{i}\tnone\tnone\t{' '.join(s1)}\t{' '.join(s2)}\t{good:.3f}")
    path.write_text("\n".join(rows) + "\n")
    return path
