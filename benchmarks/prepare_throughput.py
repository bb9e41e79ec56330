"""prepare-bert against Google's own ``create_pretraining_data.py`` (PyPI ``bert-tensorflow``
1.0.4) on the same Google-format text, vocab and settings, in the same run: seconds, documents/s
and MB/s per process, peak memory, and the instance statistics both produce (instances per
document, tokens per instance, masked fraction, random-next fraction). Then hvd_bert alone on 1
and 2 processes (mpirun), on a Wikipedia-format dump of the same text, and at 4x the text with
4x the shards (memory is one shard's, not the corpus's).

The text is the built-in corpus (Python standard library docstrings, real English prose in
Google's format), its documents repeated to --mb megabytes.

    .venv/bin/python benchmarks/prepare_throughput.py [--mb 8] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PY = sys.executable
SETTINGS = {"max_seq_length": 128, "max_predictions_per_seq": 20, "masked_lm_prob": 0.15, "dupe_factor": 5}


def timed(cmd: list[str], env=None) -> tuple[float, int]:
    """(seconds, peak RSS MiB of the largest process) of a command, by GNU time."""
    res = subprocess.run(["/usr/bin/time", "-f", "%e %M", *cmd], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    sec, kb = res.stderr.strip().splitlines()[-1].split()
    return float(sec), int(kb) // 1024


def stats(files: list[Path], documents: int) -> dict:
    from hvd_bert.data.kinds import pretraining_spec
    from hvd_bert.data.records import decode_example, iter_records

    spec = pretraining_spec(SETTINGS["max_seq_length"], SETTINGS["max_predictions_per_seq"])
    n = tokens = masked = rnd = 0
    for f in files:
        for _, rec in iter_records(f):
            ex = decode_example(rec, spec)
            n += 1
            tokens += int(ex["input_mask"].sum())
            masked += int(ex["masked_lm_weights"].sum())
            rnd += int(ex["next_sentence_labels"][0])
    return {"instances": n, "instances_per_document": n / documents, "tokens_per_instance": tokens / n,
            "masked_fraction": masked / tokens, "random_next_fraction": rnd / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=8, help="megabytes of text")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    from hvd_bert.cluster import launch
    from hvd_bert.data.vocab import train_vocab
    from hvd_bert.data.corpus import stdlib_documents
    from tests.wiki_dump import article_pages, write_dump

    tmp = Path(tempfile.mkdtemp(prefix="prep-bench-"))
    base = stdlib_documents(3_000_000)
    docs, size = [], 0
    while size < a.mb * 1e6:
        for d in base:
            docs.append(d)
            size += sum(len(s.encode()) + 1 for s in d) + 1
            if size >= a.mb * 1e6:
                break
    text = tmp / "corpus.txt"
    text.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    big = tmp / "corpus4.txt"
    big.write_text(("\n\n".join("\n".join(d) for d in docs) + "\n\n") * 4, encoding="utf-8")
    mb = text.stat().st_size / 1e6
    vocab = train_vocab([text], tmp / "v", 8192)
    print(f"text: {len(docs)} documents, {mb:.2f} MB (built-in corpus repeated); vocab {vocab}")
    flags = [f"--{k}={v}" for k, v in SETTINGS.items()]
    ours = ["--max-seq-length", "128", "--max-predictions-per-seq", "20", "--masked-lm-prob", "0.15",
            "--dupe-factor", "5", "--vocab", str(vocab), "--overwrite"]
    hvd = [PY, "-m", "hvd_bert", "prepare-bert"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    mpi_env = dict(launch.mpi_env(), **{k: env[k] for k in ("TF_CPP_MIN_LOG_LEVEL", "OMP_NUM_THREADS",
                                                          "TOKENIZERS_PARALLELISM")})
    rows = []

    def row(name, procs, sec, peak, out_files, n_docs, nbytes):
        r = {"variant": name, "processes": procs, "seconds": sec, "peak_rss_mib": peak,
             "documents_per_s_per_process": n_docs / sec / procs, "mb_per_s_per_process": nbytes / 1e6 / sec / procs}
        if out_files:
            r.update(stats(out_files, n_docs))
        rows.append(r)
        print(f"  {name:44s} {procs} proc  {sec:7.1f} s  {peak:6d} MiB  "
              f"{r['documents_per_s_per_process']:8.0f} docs/s/proc  "
              f"{r['mb_per_s_per_process']:6.2f} MB/s/proc" + (f"  {r['instances']} instances, "
              f"{r['instances_per_document']:.2f}/doc, {r['tokens_per_instance']:.1f} tokens, masked "
              f"{r['masked_fraction']:.4f}, random next {r['random_next_fraction']:.4f}" if out_files else ""))
        return r

    # Google's create_pretraining_data.py: one process, one output file
    g_out = tmp / "google.tfrecord"
    sec, peak = timed([PY, "-m", "bert.create_pretraining_data", f"--input_file={text}", f"--output_file={g_out}",
                       f"--vocab_file={vocab}", "--do_lower_case=True", "--random_seed=12345", *flags], env=env)
    google = row("Google create_pretraining_data.py", 1, sec, peak, [g_out], len(docs), text.stat().st_size)
    for shards in (1, 8):
        out = tmp / f"ours-{shards}"
        sec, peak = timed([*hvd, "--input", str(text), "--output", str(out), "--num-shards", str(shards), *ours],
                          env=env)
        r = row(f"hvd_bert prepare-bert, {shards} shard(s)", 1, sec, peak, sorted(out.glob("*.tfrecord")),
                len(docs), text.stat().st_size)
        r["speedup_vs_google_per_process"] = google["seconds"] / r["seconds"]
    one_sec = rows[-1]["seconds"]
    out = tmp / "ours-np2"
    cmd = launch.command(["-m", "hvd_bert", "prepare-bert", "--input", str(text), "--output", str(out),
                          "--num-shards", "8", *ours], np=2, launcher="mpi")
    sec, peak = timed(cmd, env=mpi_env)
    r = row("hvd_bert prepare-bert, 8 shards, mpirun -np 2", 2, sec, peak, sorted(out.glob("*.tfrecord")),
            len(docs), text.stat().st_size)
    r["speedup_vs_1_process"] = one_sec / sec
    identical = all((tmp / "ours-8" / f.name).read_bytes() == f.read_bytes() for f in out.glob("*.tfrecord"))
    print(f"  1 and 2 processes byte-identical: {identical}; 2-process speed-up {one_sec / sec:.2f}x")
    # 4x the text, 4x the shards: memory stays one shard's
    out = tmp / "ours-4x"
    sec, peak = timed([*hvd, "--input", str(big), "--output", str(out), "--num-shards", "32", *ours], env=env)
    row("hvd_bert, 4x the text, 32 shards", 1, sec, peak, [], 4 * len(docs), big.stat().st_size)
    big1 = sec
    cmd = launch.command(["-m", "hvd_bert", "prepare-bert", "--input", str(big), "--output", str(tmp / "ours-4x-np2"),
                          "--num-shards", "32", "--split-mb", str(big.stat().st_size / 2 ** 20 / 4), *ours],
                         np=2, launcher="mpi")
    sec, peak = timed(cmd, env=mpi_env)
    r = row("hvd_bert, 4x the text, 32 shards, mpirun -np 2", 2, sec, peak, [], 4 * len(docs), big.stat().st_size)
    r["speedup_vs_1_process"] = big1 / sec
    print(f"  4x the text: 2-process speed-up {big1 / sec:.2f}x")
    # the same text as a Wikipedia dump (wikiextractor + syntok)
    dump = write_dump(tmp / "enwiki-pages-articles.xml", article_pages(docs))
    out = tmp / "ours-wiki"
    sec, peak = timed([*hvd, "--input", str(dump), "--output", str(out), "--num-shards", "8", *ours], env=env)
    wiki_docs = json.loads((out / "dataset.json").read_text())["documents"]
    row("hvd_bert, the text as a Wikipedia XML dump", 1, sec, peak, sorted(out.glob("*.tfrecord")), wiki_docs,
        dump.stat().st_size)
    wiki1 = rows[-1]["seconds"]
    out = tmp / "ours-wiki-np2"
    cmd = launch.command(["-m", "hvd_bert", "prepare-bert", "--input", str(dump), "--output", str(out),
                          "--num-shards", "8", "--split-mb", str(dump.stat().st_size / 2 ** 20 / 4), *ours],
                         np=2, launcher="mpi")
    sec, peak = timed(cmd, env=mpi_env)
    r = row("hvd_bert, Wikipedia XML dump, mpirun -np 2", 2, sec, peak, [], wiki_docs, dump.stat().st_size)
    r["speedup_vs_1_process"] = wiki1 / sec
    print(f"  Wikipedia dump: 2-process speed-up {wiki1 / sec:.2f}x")
    report = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "text_mb": mb, "documents": len(docs), "settings": SETTINGS, "identical_1_vs_2": identical,
              "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
