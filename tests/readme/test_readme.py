"""Every code block of README.md, then of docs/frontends.md, run as written, in order, in one
sandbox.

The sandbox is a folder of symlinks to this checkout (so `make demo`, `.venv/bin/hvd-bert` and
`examples/` resolve as in the repository) with its own HOME: the built-in data is prepared
afresh under it and relative outputs (`runs/`, `data/`) land in the sandbox. The venv is
active and root may run OpenMPI, as the README says. The files the README calls the user's
(`train.tsv`, `dev.tsv`, `a.txt`, `b.txt`, a Wikipedia dump, `books/`, `web/*.txt.gz`, a
Hugging Face checkpoint in
`~/models/bert-base-uncased`, SQuAD's `train-v1.1.json` and `dev-v1.1.json`, MovieLens'
`ml-1m/ratings.dat` and `ml-20m/ratings.csv`) are
written by the fixture in those formats, small. A Python block is saved under the file name
its first line gives and run with the command that line gives. A `text` block is a listing,
not code. Only `make test` is not run: it is the suite this test belongs to.

Select with `-m readme`, skip with `-m 'not readme'`.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = [README, ROOT / "docs" / "frontends.md"]  # the pages whose blocks run, in this order
NOT_RUN = {"make test": "the README's test command is the suite that runs this test"}
LINKED = ["Makefile", "scripts", "hvd_bert", "examples", "setup.py", "requirements.txt", "recipes", "docs",
          "requirements-dev.txt", ".venv", "slurm", "docker", "benchmarks"]

pytestmark = pytest.mark.readme


def code_blocks(text: str, page: str = "README.md") -> list[tuple[str, str, str]]:
    """``(where, language, code)`` of every fenced block (``where``: page and line)."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if m:
            start, body = i + 1, []
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append((f"{page} line {start}", m.group(1), "\n".join(body) + "\n"))
        i += 1
    return blocks


BLOCKS = [b for page in DOCS for b in code_blocks(page.read_text(), str(page.relative_to(ROOT)))]


def test_the_guides_blocks_are_blocks_that_run_here_and_no_example_is_missing():
    """docs/jobs.md and docs/clusters.md repeat README blocks beside their detail: each of their
    blocks is one this test runs (so none goes stale), and no paragraph of the docs ends in a
    colon with no block after it (an example lost in an edit)."""
    runs = {code for _, _, code in BLOCKS}
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text()
        if page.name in ("jobs.md", "clusters.md"):
            stale = [where for where, lang, code in code_blocks(text, page.name) if lang == "bash"
                     and code not in runs]
            assert not stale, f"blocks that no test runs: {stale}"
        lines = text.splitlines()
        lost = [f"{page.name} line {n + 1}" for n, line in enumerate(lines[:-2])
                if line.endswith(":") and not line.startswith(("|", "#", " ", "-")) and lines[n + 1] == ""
                and not lines[n + 2].startswith(("```", "|", "-", "    ", "1.", "*"))]
        assert not lost, f"paragraphs that end in a colon with no example after them: {lost}"


def test_every_block_has_a_language_this_test_knows():
    assert BLOCKS and all(lang in ("bash", "python", "text") for _, lang, _ in BLOCKS), \
        [(line, lang) for line, lang, _ in BLOCKS if lang not in ("bash", "python", "text")]


# ----------------------------------------------------------------------------- the user's files
WORDS_POS = ["good", "great", "fine", "nice", "happy", "bright"]
WORDS_NEG = ["bad", "poor", "awful", "sad", "dark", "broken"]
FILLER = ["the", "module", "returns", "a", "value", "for", "each", "file", "and", "list", "of", "names",
          "this", "function", "object", "string"]


def _sentences(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = []
    for j in range(n):
        label = "pos" if j % 2 else "neg"
        words = rng.sample(FILLER, 6) + [rng.choice(WORDS_POS if label == "pos" else WORDS_NEG)]
        rng.shuffle(words)
        rows.append((" ".join(words), label))
    return rows


def _tsv(path: Path, rows) -> None:
    path.write_text("sentence\tlabel\n" + "".join(f"{s}\t{label}\n" for s, label in rows))


def _hf_checkpoint(folder: Path) -> None:
    """A small random BERT saved by transformers in the published layout (config.json,
    model.safetensors, vocab.txt, tokenizer_config.json)."""
    import torch
    import transformers

    words = sorted(set(FILLER + WORDS_POS + WORDS_NEG) | {chr(c) for c in range(ord("a"), ord("z") + 1)})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *words]
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    transformers.BertForPreTraining(cfg).save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))


def _ratings(n_users: int, n_items: int, per_user: int, seed: int) -> list[tuple[int, int, int, int]]:
    rng = random.Random(seed)
    rows = []
    for u in range(1, n_users + 1):
        for t, i in enumerate(rng.sample(range(1, n_items + 1), per_user)):
            rows.append((u, i, rng.randint(1, 5), 978300000 + 1000 * u + t))
    return rows


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    root = tmp_path_factory.mktemp("readme")
    work, home = root / "repo", root / "home"
    work.mkdir()
    home.mkdir()
    for name in LINKED:
        if (ROOT / name).exists():
            (work / name).symlink_to(ROOT / name)
    _tsv(work / "train.tsv", _sentences(400, 1))
    _tsv(work / "dev.tsv", _sentences(100, 2))
    from hvd_bert.data.corpus import stdlib_documents
    docs = stdlib_documents(max_bytes=600_000)
    assert len(docs) >= 128
    for name, part in (("a.txt", docs[0::2]), ("b.txt", docs[1::2])):
        (work / name).write_text("\n\n".join("\n".join(d) for d in part) + "\n")
    _hf_checkpoint(home / "models" / "bert-base-uncased")
    import sys
    sys.path.insert(0, str(ROOT / "tests"))
    import squad_task
    import wiki_dump
    wiki_dump.write_dump(work / "enwiki-latest-pages-articles1.xml-p1p41242.bz2",
                         wiki_dump.SAMPLE_PAGES + wiki_dump.article_pages(docs[:40]))
    (work / "books").mkdir()
    (work / "web").mkdir()
    for i, d in enumerate(docs[40:50]):
        (work / "books" / f"book-{i}.txt").write_text(" ".join(d[: len(d) // 2]) + "\n\n"
                                                       + " ".join(d[len(d) // 2:]) + "\n")
    import gzip
    for k in range(2):
        with gzip.open(work / "web" / f"part-{k}.txt.gz", "wt") as f:
            f.writelines(" ".join(d) + "\n" for d in docs[50 + 10 * k:60 + 10 * k])
    squad_task.write(work / "train-v1.1.json", 60, 0)
    squad_task.write(work / "dev-v1.1.json", 20, 1)
    (work / "ml-1m").mkdir()
    (work / "ml-1m" / "ratings.dat").write_text(
        "".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in _ratings(300, 400, 20, 3)))
    (work / "ml-20m").mkdir()
    (work / "ml-20m" / "ratings.csv").write_text("userId,movieId,rating,timestamp\n" + "".join(
        f"{u},{i},{r}.0,{t}\n" for u, i, r, t in _ratings(200, 300, 15, 4)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVD_BERT_", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), VIRTUAL_ENV=str(work / ".venv"), PYTHONPATH="",
               PATH=f"{work / '.venv' / 'bin'}:{env['PATH']}",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return work, env


# Horovod 0.28.1's Gloo transport can abort a surviving worker when a peer dies mid-message
# (tests/parallel/test_elastic.py meets it too): the README's elastic block is run once more then
UPSTREAM_ABORT = "terminate called after throwing an instance of 'gloo::"


def _upstream_abort(work: Path, since: float) -> bool:
    """Whether a log the block wrote (``*.log`` in the sandbox) holds Gloo's abort."""
    return any(p.stat().st_mtime >= since and UPSTREAM_ABORT in p.read_text(errors="replace")
               for p in work.glob("*.log"))


def _run(cmd, work: Path, env: dict, timeout: int = 1500) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)


def _kill_strays(work: Path) -> None:
    """kill -9 every process still working in the sandbox (a job's workers started over ssh live
    in the fake nodes' sshd sessions, outside the block's process group)."""
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and Path(os.readlink(p / "cwd")).is_relative_to(work):
                os.kill(int(p.name), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def _run_block(script: list[str], work: Path, env: dict, timeout: int = 1500) -> subprocess.CompletedProcess:
    """Run a bash block in its own session. It is stopped (the session and its strays killed)
    after ``timeout`` s, or 90 s after a log of it shows Gloo's abort (UPSTREAM_ABORT): Horovod's
    elastic driver then starts no new workers and the job would wait out its 600 s elastic
    timeout, after which horovodrun does not exit either."""
    started = time.time()
    out, err = work / ".block.out", work / ".block.err"
    with open(out, "w") as fo, open(err, "w") as fe:
        proc = subprocess.Popen(script, cwd=work, env=env, stdout=fo, stderr=fe, text=True,
                                start_new_session=True)
        aborted_at, why = None, ""
        while proc.poll() is None:
            time.sleep(2)
            if aborted_at is None and _upstream_abort(work, started):
                aborted_at = time.time()
            if time.time() - started > timeout:
                why = f"\n(stopped after {timeout} s)"
            elif aborted_at is not None and time.time() - aborted_at > 90:
                why = f"\n(stopped 90 s after {UPSTREAM_ABORT})"
            if why:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                _kill_strays(work)
    return subprocess.CompletedProcess(script, proc.returncode, out.read_text(), err.read_text() + why)


@pytest.mark.parametrize("line,lang,code", [b for b in BLOCKS if b[1] != "text"],
                         ids=[f"{b[0].replace('.md line ', '-line').replace('/', '-')}-{b[1]}"
                              for b in BLOCKS if b[1] != "text"])
def test_readme_block_runs_as_written(sandbox, line, lang, code):
    work, env = sandbox
    if lang == "python":
        m = re.match(r"# (\S+\.py) -- run it with: (.+)$", code.splitlines()[0])
        assert m, f"{line}: a Python block starts with '# NAME.py -- run it with: COMMAND'"
        (work / m.group(1)).write_text(code)
        res = _run(["bash", "-c", m.group(2)], work, env)
    else:
        kept = [ln for ln in code.splitlines() if ln.split("#")[0].strip() not in NOT_RUN]
        script = ["bash", "-e", "-o", "pipefail", "-c", "\n".join(kept) + "\n"]
        started = time.time()
        res = _run_block(script, work, env)
        if "fake_cluster.sh up" in code:  # a block that failed half-way leaves no cluster up
            _run(["bash", "scripts/fake_cluster.sh", "down"], work, env, timeout=120)
        if res.returncode != 0 and _upstream_abort(work, started):
            print(f"{line}: a surviving worker was aborted by Gloo ({UPSTREAM_ABORT}), as "
                  f"Horovod 0.28.1 sometimes does when a peer dies mid-message; running the block once more")
            for folder in re.findall(r"train\.output_dir=(\S+)", code):
                shutil.rmtree(work / folder, ignore_errors=True)
            res = _run_block(script, work, env)
            if "fake_cluster.sh up" in code:
                _run(["bash", "scripts/fake_cluster.sh", "down"], work, env, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 0, f"{line} failed ({res.returncode}):\n{code}\n---\n{out[-6000:]}"
    assert "<stderr>:Traceback" not in out and "\nTraceback" not in out, out[-6000:]
    if "finetune --task squad" in code:  # the predictions file is scored as the official script does
        assert re.search(r'\{"exact_match": [0-9.]+, "f1": [0-9.]+\}', out), out[-3000:]
        answers = [json.loads(line) for line in (work / "answers.jsonl").read_text().splitlines()]
        assert len(answers) == 1 and answers[0]["id"] == "1" and 0 < answers[0]["probability"] <= 1, answers
        assert answers[0]["answer"] in "The note was written by Ada Lovelace in 1843.", answers
    if "--set train.optim.lr=1e-3 --set epochs=10" in code:  # the fine-tuning example learns
        acc = [float(a) for a in re.findall(r"eval at step \d+: accuracy ([0-9.]+)", out)]
        assert acc and acc[-1] > 0.8, out[-3000:]
