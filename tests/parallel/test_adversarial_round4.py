"""The fourth adversarial round, through the command line: outputs never over a sharded run's
files, a sharded checkpoint that trusts nothing it reads, numbers past their type's range, input
kinds that do not match the model's task, label maps that are not one-to-one, and a user's
script's exit status named truthfully by ``launch``. Every case ends in one line and its
documented status, is bounded in time, and leaves every input byte-identical."""

import json
import shutil
from pathlib import Path

import pytest

from one_process import hvd, one_line, pretrain
from test_adversarial_round3 import classifier, digests

VOCAB = Path(__file__).parents[1] / "data" / "stdlib-uncased-1500-vocab.txt"


@pytest.fixture(scope="module")
def sharded_template(bert_data, tmp_path_factory):
    """A finished 2-step PyTorch run that saved a sharded checkpoint (one process)."""
    out = tmp_path_factory.mktemp("sharded") / "run"
    res = pretrain(bert_data, out, "--set", "train.checkpoint_format=sharded")
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.fixture
def sharded_run(sharded_template, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(sharded_template, out)
    return out


def the_shards(run):
    (ckpt,) = sorted(run.glob("ckpt-*.shards"))
    return ckpt


def test_no_output_over_a_sharded_runs_files(sharded_run, tmp_path):
    """The .shards folder belongs to its run folder: its config.json, best model and checkpoints
    are what the command reads, whichever path names the input."""
    ckpt = the_shards(sharded_run)
    (sharded_run / "best.npz").write_bytes(b"a best model")
    before = digests(sharded_run)
    for out in (sharded_run / "config.json", sharded_run / "best.npz", ckpt / "index.json"):
        one_line(hvd("convert", ckpt, "--output", out), str(out), "which this command reads")
    one_line(hvd("convert", ckpt, "--to", "hf", "--output", sharded_run / "hf"), "lies inside")
    assert digests(sharded_run) == before


def test_a_sharded_export_carries_its_vocabulary(sharded_run, bert_data, tmp_path):
    """convert of a .shards folder (and of its run folder) finds the vocabulary of the data its
    run trained on, and transformers' fill-mask pipeline on the export answers with its words,
    the same top tokens as the toolkit's own model on the sharded checkpoint."""
    import torch
    import transformers

    from hvd_bert.pt.models.bert import BertForPreTraining, load_weights, read_checkpoint_weights

    for source, out in ((the_shards(sharded_run), tmp_path / "hf"), (sharded_run, tmp_path / "hf-run")):
        res = hvd("convert", source, "--to", "hf", "--output", out)
        assert res.returncode == 0, res.stderr[-2000:]
        assert (out / "vocab.txt").read_bytes() == (bert_data / "vocab.txt").read_bytes()
    fill = transformers.pipeline("fill-mask", model=str(tmp_path / "hf"), top_k=3, device="cpu")
    got = fill("the function returns a [MASK] value")
    assert got and all(g["token_str"].strip() for g in got), got
    tok = transformers.BertTokenizer.from_pretrained(tmp_path / "hf")
    enc = tok("the function returns a [MASK] value", return_tensors="pt")
    arrays, config = read_checkpoint_weights(the_shards(sharded_run))
    ours = BertForPreTraining(config).eval()
    load_weights(ours, arrays, source="test")
    ids = enc["input_ids"]
    at = ids[0].tolist().index(tok.mask_token_id)
    with torch.no_grad():
        mlm, _ = ours(ids, enc["token_type_ids"], enc["attention_mask"], torch.tensor([[at]]))
    assert [g["token"] for g in got] == mlm[0, 0, :config.vocab_size].topk(3).indices.tolist()


def edit(path, change):
    index = json.loads(path.read_text())
    change(index)
    path.write_text(json.dumps(index))


def first(index):
    return next(e for f in index["files"].values() for e in f["pieces"].values())


DAMAGES = {
    "a range past its tensor": (lambda i: first(i).__setitem__("flat", [0, 10**9]), "range"),
    "a negative shape": (lambda i: first(i).__setitem__("shape", [-3]), "not a list of counts"),
    "mistyped meta": (lambda i: i["meta"].__setitem__("scaler", "x"), "scaler"),
    "a claimed huge tensor": (lambda i: first(i).__setitem__("shape", [2**31, 512]), "cover"),
    "a shape no array takes": (lambda i: first(i).__setitem__("shape", [2**62, 2**62, 0]), "more than the"),
    "a ZeRO stage there is not": (
        lambda i: i["meta"].__setitem__("layout", {"world_size": 1, "zero_stage": 3}), "ZeRO stage (0 to 2)"),
    "a name with a direction override": (
        lambda i: first(i).__setitem__("name", "model/\u00e9vil\u202e.weight"), "not a name a checkpoint"),
    "a layout of no ranks": (lambda i: i["meta"].__setitem__("layout", {"world_size": 1,
                                                                          "tensor_parallel": 0}),
                             "not counts of ranks"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_index_is_one_line_for_every_reader(damage, sharded_run, bert_data, tmp_path):
    """convert, a resume and init_checkpoint all refuse it in one line, before reading a tensor."""
    change, words = DAMAGES[damage]
    ckpt = the_shards(sharded_run)
    edit(ckpt / "index.json", change)
    before = digests(sharded_run)
    one_line(hvd("convert", ckpt, "--output", tmp_path / "w.npz", timeout=120), "index.json", words)
    assert not (tmp_path / "w.npz").exists()
    if damage == "mistyped meta":  # (the run resumes: its metadata is read)
        one_line(pretrain(bert_data, sharded_run, "--set", "train.checkpoint_format=sharded", steps=3),
                 "index.json", words)
    assert digests(sharded_run) == before


@pytest.mark.parametrize("setting, words", [
    ("train.seed=1180591620717411303424", "outside the 64-bit integers"),
    ("train.seed=-1", "train.seed must be in [0,"),
    ("train.seed=4294967296", "train.seed must be in [0,"),
    ("train.batch.local_batch_size=99999999999999999999", "outside the 64-bit integers"),
])
def test_numbers_past_their_range_are_one_line(setting, words, bert_data, tmp_path):
    one_line(pretrain(bert_data, tmp_path / "r", "--set", setting, timeout=120), words)
    assert not (tmp_path / "r").exists()


def test_options_past_their_range_are_refused(tmp_path):
    for args in (("prepare-ncf", "--output", tmp_path / "n", "--synthetic", "ml-1m", "--seed", "-1"),
                 ("prepare-ncf", "--output", tmp_path / "n", "--synthetic", "ml-1m", "--seed", str(2**64)),
                 ("simulate", "--samples", str(2**70))):
        line = one_line(hvd(*args, timeout=60))  # (argparse's usage block is not printed: one line)
        assert "seed in [0," in line or "64-bit" in line or "not a count from 1 to" in line, line
    assert not (tmp_path / "n").exists()
    corpus = tmp_path / "c.txt"
    corpus.write_text("One sentence here. Another one there.\n\nA second document.\n")
    for args in (("prepare-bert", "--input", corpus, "--output", tmp_path / "b", "--split-mb", v)
                 for v in ("inf", "nan", "-5", "0")):
        one_line(hvd(*args, timeout=60), "--split-mb", "is not a finite number more than 0")
    for args in (("prepare-ncf", "--output", tmp_path / "n", "--synthetic", "ml-1m", "--scale", "nan"),
                 ("prepare-bert", "--input", corpus, "--output", tmp_path / "b", "--masked-lm-prob", "1.5"),
                 ("simulate", "--fusion-mb", "-1")):
        one_line(hvd(*args, timeout=60), "is not a finite number")
    for args in (("simulate", "--k", "0"), ("simulate", "--gpus", "8", "-4"), ("simulate", "--samples", "0")):
        one_line(hvd(*args, timeout=60), "is not a count from 1 to")
    one_line(hvd("ncf", "--set", "model.dropout=1.5", "--set", f"train.output_dir={tmp_path / 'r'}",
                 timeout=60), "model.dropout is a probability in [0, 1)")
    assert not (tmp_path / "r").exists()
    assert not (tmp_path / "n").exists() and not (tmp_path / "b").exists()


def test_a_classifier_given_squad_input_refuses(finished_run, tmp_path):
    model = classifier(finished_run, tmp_path / "clf")
    squad = tmp_path / "dev.json"
    squad.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": "the cat sat", "qas": [{"id": "1", "question": "who sat", "answers": []}]}]}]}))
    jl = tmp_path / "q.jsonl"
    jl.write_text(json.dumps({"question": "who sat", "context": "the cat sat"}) + "\n")
    for source in (squad, jl):
        one_line(hvd("predict", model, source), "SQuAD questions and contexts", "classifies texts")
    assert not list(tmp_path.glob("*.predictions.jsonl"))


@pytest.mark.parametrize("id2label, words", [
    ({"0": "pos", "1": "pos"}, "names outputs 0 and 1"),
    ({"0": "neg", "2": "pos"}, "are not the outputs 0 to 1"),
    ({"0": "neg", "1": ""}, "not a list of names"),
])
def test_a_label_map_that_is_not_one_to_one_is_refused(id2label, words, finished_run, tmp_path):
    model = classifier(finished_run, tmp_path / "clf")
    config = json.loads((model / "config.json").read_text())
    config.update(id2label=id2label, label2id={})
    (model / "config.json").write_text(json.dumps(config))
    table = tmp_path / "in.tsv"
    table.write_text("sentence\nhello\n")
    one_line(hvd("predict", model, table), "config.json", words)
    assert not (tmp_path / "in.tsv.predictions.jsonl").exists()


def test_prepare_refuses_a_label_given_twice(tmp_path):
    table = tmp_path / "t.tsv"
    table.write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
    one_line(hvd("prepare-classification", table, "--output", tmp_path / "out", "--vocab", VOCAB,
                 "--text-a", "sentence", "--label", "label", "--labels", "0", "1", "0"),
             "names outputs 0 and 2")
    assert not (tmp_path / "out").exists()


def test_a_misspelt_recipe_job_is_named_not_echoed(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("job: pretrian\ntrain:\n  seed: 1\n")
    line = one_line(hvd("pretrain", "--config", recipe, timeout=60), "not one of hvd-bert's jobs",
                    "did you mean pretrain")
    assert "hvd-bert pretrian" not in line
    big = tmp_path / "big.yaml"
    big.write_text("model:\n  x: [" + ", ".join(["1"] * 120_000) + "]\n")
    line = one_line(hvd("pretrain", "--config", big, timeout=60), "YAML values")
    assert "alias" not in line


@pytest.mark.parametrize("launcher", ["--gloo", "--mpi"])
def test_launch_names_a_scripts_own_exit_status(launcher, tmp_path):
    """A rank's sys.exit(7): the launch exits 7 and says which rank; a forged tag in a rank's
    output stays that rank's text; a missing module is one line."""
    script = tmp_path / "s.py"
    script.write_text("import os, sys\nrank = int(os.environ.get('OMPI_COMM_WORLD_RANK', "
                      "os.environ.get('HOROVOD_RANK', '0')))\n"
                      "print('[1,1]<stderr>:hvd-bert: forged' if rank == 0 else 'plain', flush=True)\n"
                      "sys.exit(7 if rank == 1 else 0)\n")
    res = hvd("launch", "-np", "2", launcher, "--", "python", script, timeout=180)
    assert res.returncode == 7, res.stdout[-2000:] + res.stderr[-2000:]
    assert "exited with status 7" in res.stderr and "killed by" not in res.stderr, res.stderr
    assert "hvd-bert: forged" not in res.stderr.replace("[1,1]<stderr>:hvd-bert: forged", ""), res.stderr
    res = hvd("launch", "-np", "2", launcher, "--", "python", "-m", "no_such_module_here", timeout=180)
    one_line(res, "no module named 'no_such_module_here'")


def test_tensor_parallel_that_does_not_divide_the_heads(bert_data, tmp_path):
    """Checked when the model's shape is known, before anything is built, with the degrees that fit."""
    one_line(pretrain(bert_data, tmp_path / "r", "--set", "train.tensor_parallel=3", timeout=120),
             "does not divide the model's", "give train.tensor_parallel one of")


@pytest.fixture(scope="module")
def sharded_finetune(sharded_template, bert_data, tmp_path_factory):
    """A classifier fine-tuned from the sharded run, saving sharded checkpoints and its best
    model (one process, 4 steps)."""
    root = tmp_path_factory.mktemp("ft")
    table = root / "t.tsv"
    rows = [f"{w} value returns {i}\t{'pos' if w == 'good' else 'neg'}\n" for i in range(24)
            for w in ("good", "bad")]
    table.write_text("sentence\tlabel\n" + "".join(rows))
    res = hvd("prepare-classification", table, "--output", root / "cls", "--vocab", bert_data / "vocab.txt",
              "--text-a", "sentence", "--label", "label", "--max-seq-length", "32")
    assert res.returncode == 0, res.stderr[-2000:]
    out = root / "run"
    res = hvd("finetune", "--set", f"data={root / 'cls'}", "--set", f"eval_data={root / 'cls'}", "--set",
              f"init_checkpoint={sharded_template}", "--set", "train.checkpoint_format=sharded", "--set",
              "train.schedule.total_steps=4", "--set", "epochs=0", "--set", "eval_every=2", "--set",
              "train.batch.local_batch_size=8", "--set", "progress=false", "--set", f"train.output_dir={out}")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert (out / "best.npz").is_file() and list(out.glob("ckpt-*.shards")), sorted(out.iterdir())
    return out, table


def test_predict_reads_a_sharded_fine_tuning_checkpoint_and_names_a_replaced_best(sharded_finetune, tmp_path):
    run, table = sharded_finetune
    run_copy = tmp_path / "run"
    shutil.copytree(run, run_copy)
    res = hvd("predict", run_copy, table, "--checkpoint", "latest", "--output", tmp_path / "latest.jsonl")
    assert res.returncode == 0 and ".shards" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    res = hvd("predict", the_shards(run_copy), table, "--output", tmp_path / "direct.jsonl")
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "direct.jsonl").read_text() == (tmp_path / "latest.jsonl").read_text()
    res = hvd("predict", run_copy, table, "--output", tmp_path / "best.jsonl")
    assert res.returncode == 0 and "at step" in res.stdout and "replaced" not in res.stdout, res.stdout
    res = hvd("convert", the_shards(run_copy), "--output", tmp_path / "other.npz")
    assert res.returncode == 0, res.stderr[-2000:]
    shutil.copyfile(tmp_path / "other.npz", run_copy / "best.npz")  # (another model under its name)
    res = hvd("predict", run_copy, table, "--output", tmp_path / "best2.jsonl")
    assert res.returncode == 0 and "best.npz was replaced after the run wrote it" in res.stdout, res.stdout


def test_a_run_switches_between_checkpoint_formats(finished_run, bert_data):
    """A consolidated run resumes as a sharded one, and back (the docs: either kind resumes the
    other's run)."""
    res = pretrain(bert_data, finished_run, "--set", "train.checkpoint_format=sharded", steps=3)
    assert res.returncode == 0 and "resumed from step 2" in res.stdout, res.stderr[-2000:]
    assert (finished_run / "ckpt-00000003.shards" / "index.json").is_file()
    res = pretrain(bert_data, finished_run, steps=4)
    assert res.returncode == 0 and "resumed from step 3" in res.stdout, res.stderr[-2000:]
    assert (finished_run / "ckpt-00000004.pt").is_file()


def test_tensorflow_starts_from_a_sharded_checkpoint(sharded_template, bert_data, tmp_path):
    """A PyTorch run's sharded checkpoint as TensorFlow's init_checkpoint (the same portable names)."""
    res = pretrain(bert_data, tmp_path / "tf", "--framework", "tf", "--set",
                   f"init_checkpoint={the_shards(sharded_template)}", steps=1, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]


def test_a_link_planted_where_the_next_sharded_checkpoint_goes(sharded_run, bert_data, tmp_path):
    """The link is removed, never followed: what it points to is untouched, the checkpoint is
    written in its place."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    (sharded_run / "ckpt-00000003.shards").symlink_to(target)
    res = pretrain(bert_data, sharded_run, "--set", "train.checkpoint_format=sharded", steps=3)
    assert res.returncode == 0, res.stderr[-2000:]
    assert not (sharded_run / "ckpt-00000003.shards").is_symlink()
    assert (sharded_run / "ckpt-00000003.shards" / "index.json").is_file()
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]


def test_the_open_files_advice_never_names_a_limit_already_met(monkeypatch):
    import resource

    from hvd_bert.cluster import resources

    for soft, hard in ((1024, 1024), (1024, 1 << 20), (1024, resource.RLIM_INFINITY)):
        monkeypatch.setattr(resource, "getrlimit", lambda _, s=soft, h=hard: (s, h))
        line = resources.descriptor_problem(100_000)
        need = resources.descriptors_needed(100_000)
        assert line and f"need at least {need}" in line, line
        raised = [int(x) for x in __import__("re").findall(r"ulimit -n (\d+)", line)]
        assert all(x >= need for x in raised), line
        if hard != resource.RLIM_INFINITY and hard < need:
            assert "start fewer ranks" in line and "hard limit" in line, line


def test_overwrite_never_replaces_what_the_run_folder_resolves_to(finished_run, bert_data, tmp_path):
    """convert --overwrite of a run folder: the data folder its vocabulary comes from is read too;
    prepare-bert --like: the phase-1 data folder it resolves to is read too."""
    before = digests(bert_data, finished_run)
    for to in ("hf", "google"):
        one_line(hvd("convert", finished_run, "--to", to, "--output", bert_data, "--overwrite"),
                 "holds the vocabulary", "which this command reads")
    one_line(hvd("prepare-bert", "--like", finished_run, "--output", bert_data, "--overwrite"),
             "which this command reads")
    assert digests(bert_data, finished_run) == before


@pytest.mark.parametrize("change, words", [
    (lambda m: m.pop("step"), "step=None, not a count (it is missing)"),
    (lambda m: m.__setitem__("micro_step", 2.5), "micro_step=2.5, not a count"),
    (lambda m: m.__setitem__("step", 10**30), "step=1000000000000000000000000000000, not a count"),
    (lambda m: m.__setitem__("step", 7), "says step 7, its name step 2"),
    (lambda m: m.pop("data"), "has no data position"),
    (lambda m: m.__setitem__("data", {"micro_step": -4}), "not counts of micro-batches"),
    (lambda m: m.__setitem__("rng", [[1], [2]]), "holds 2 random states for its 1 ranks"),
    (lambda m: m.__setitem__("data_parallel_size", 7), "data_parallel_size=7, which does not divide its"),
    (lambda m: (m.__setitem__("micro_step", 2**61), m["data"].__setitem__("micro_step", 2**61)),
     "micro_step=2305843009213693952, more micro-batches than its 2 steps can have read"),
])
def test_a_checkpoints_metadata_is_checked_before_the_resume_counts_from_it(change, words, sharded_run,
                                                                             bert_data):
    """Every field the resume counts from (step, micro-batches, data position, random states) is
    checked: one line, exit 2, before anything loops on it (a micro_step of 2.5 used to spin)."""
    edit(the_shards(sharded_run) / "index.json", lambda i: change(i["meta"]))
    before = digests(sharded_run)
    res = pretrain(bert_data, sharded_run, "--set", "train.checkpoint_format=sharded", steps=4, timeout=120)
    one_line(res, "is damaged: its metadata", words)
    assert digests(sharded_run) == before


@pytest.mark.parametrize("launcher", ["--gloo", "--mpi"])
def test_a_scripts_status_is_its_own_whatever_it_prints(launcher, tmp_path):
    """exit 255 is a status, not a signal; a script that prints the toolkit's error prefix or a
    stall line still exits with its own status, named with its rank (a script's 5 is not a stall)."""
    script = tmp_path / "s.py"
    script.write_text("import sys\nerr = sys.stderr\n"
                      "print('hvd-bert: looks like a toolkit error', file=err, flush=True)\n"
                      "print('hvd-bert pretrain: rank 1 stalled: no progress', file=err, flush=True)\n"
                      "sys.stdout.buffer.write(b'not UTF-8: \\xff\\xfe\\n')\nsys.stdout.flush()\n"
                      "print('after the bytes', flush=True)\n"
                      "sys.exit(int(sys.argv[1]))\n")
    # (137 is 128 + SIGKILL, 5 and 2 the toolkit's stall and error: statuses of its own all the same)
    for status in (255, 137, 7, 5, 2):
        res = hvd("launch", "-np", "2", launcher, "--", "python", script, str(status), timeout=180)
        assert res.returncode == status, (status, res.stderr[-2000:])
        assert "killed by" not in res.stderr and f"exited with status {status}" in res.stderr, res.stderr
        assert "Exception in thread" not in res.stderr and "Traceback" not in res.stderr, res.stderr
        # (a rank's output goes on after the bytes; the other rank may be ended before it prints)
        assert "not UTF-8: \ufffd\ufffd" in res.stdout and "after the bytes" in res.stdout, res.stdout


def test_more_ranks_than_the_memory_holds_are_refused_before_any_starts(tmp_path):
    import time

    t0 = time.monotonic()
    for args in (("launch", "-np", "100000", "--", "python", "-c", "pass"), ("ncf", "-np", "100000")):
        one_line(hvd(*args, timeout=60), "100000 ranks on this machine need at least", "start at most")
    assert time.monotonic() - t0 < 60


def test_a_shard_that_is_not_a_regular_file_is_named(sharded_run, tmp_path):
    import os

    shard = the_shards(sharded_run) / "rank-00000.safetensors"
    shard.unlink()
    os.mkfifo(shard)  # (opening it would block: it must never be opened)
    one_line(hvd("convert", the_shards(sharded_run), "--output", tmp_path / "w.npz", timeout=60),
             "rank-00000.safetensors is not a regular file")
    shard.unlink()
    shard.symlink_to("/dev/zero")
    one_line(hvd("convert", the_shards(sharded_run), "--output", tmp_path / "w.npz", timeout=60),
             "is not a regular file")


def test_an_index_that_is_not_a_regular_file_is_damage_not_an_interrupted_save(sharded_run, bert_data):
    """Only a missing index.json makes a checkpoint incomplete (the writer's last step): a pipe or
    a dangling link in its place is named as damage, the run does not start over from step 0 and
    nothing is deleted."""
    import os

    index = the_shards(sharded_run) / "index.json"
    index.unlink()
    for plant in (lambda: os.mkfifo(index), lambda: index.symlink_to(index.parent / "gone.json")):
        plant()
        before = sorted(p.name for p in the_shards(sharded_run).iterdir())
        res = pretrain(bert_data, sharded_run, "--set", "train.checkpoint_format=sharded", steps=4,
                       timeout=120)
        one_line(res, "index.json is not a regular file")
        assert sorted(p.name for p in the_shards(sharded_run).iterdir()) == before
        index.unlink()


def test_an_output_that_is_a_hard_link_of_a_checkpoints_file_is_refused(sharded_finetune, tmp_path):
    import os

    run, table = sharded_finetune
    link = tmp_path / "linked.tsv"
    os.link(run / "task.json", link)
    before = digests(run)
    one_line(hvd("predict", run, table, "--output", link), "is a hard link of", "task.json")
    assert digests(run) == before


def test_an_export_whose_task_names_other_labels_than_its_head_is_refused(sharded_finetune, tmp_path):
    run, _ = sharded_finetune
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    task = json.loads((copy / "task.json").read_text())
    task["labels"] = ["a", "b", "c"]
    (copy / "task.json").write_text(json.dumps(task))
    one_line(hvd("convert", copy, "--to", "hf", "--output", tmp_path / "hf"), "names 3 labels",
             "has 2 outputs")
    assert not (tmp_path / "hf").exists()


def test_a_checkpoint_without_its_ranks_random_states_is_refused(sharded_run, bert_data):
    """A resume repeats every rank's random stream: a checkpoint whose states were deleted is
    damaged, not a fresh start."""
    edit(the_shards(sharded_run) / "index.json", lambda i: i["meta"].pop("rng"))
    res = pretrain(bert_data, sharded_run, "--set", "train.checkpoint_format=sharded", steps=4, timeout=120)
    one_line(res, "is damaged: its metadata holds no list of random states for its 1 ranks")


def edit_with_manifest(ckpt, change):
    """Edit the index and the manifest its pieces were merged from alike (as an attacker would)."""
    edit(ckpt / "index.json", lambda i: change(i["files"]["rank-00000.safetensors"]["pieces"]))
    edit(ckpt / "rank-00000.json", lambda m: change(m["pieces"]))


def test_convert_refuses_an_index_that_lost_swapped_or_reshaped_tensors(sharded_template, sharded_run,
                                                                         tmp_path):
    """An index edited alone disagrees with its shard's manifest (names swapped between two
    tensors of one shape: no size or CRC check sees it); edited with it, convert still checks
    every encoder tensor against the run's bert_config.json before writing (a missing or
    reshaped tensor would be exported as a model without it); JSON nested past the parser's
    depth is one line too."""
    ckpt = the_shards(sharded_run)
    pieces = json.loads((ckpt / "index.json").read_text())["files"]["rank-00000.safetensors"]["pieces"]
    q, k = (next(key for key, e in pieces.items() if e["name"] == f"model/layers.0.{n}.weight")
            for n in ("query", "key"))

    def swap(p):
        p[q]["name"], p[k]["name"] = p[k]["name"], p[q]["name"]

    def halve(p):
        rows, cols = p[q]["shape"]
        p[q]["shape"] = [rows * 2, cols // 2]

    edit(ckpt / "index.json", lambda i: swap(i["files"]["rank-00000.safetensors"]["pieces"]))
    one_line(hvd("convert", ckpt, "--output", tmp_path / "w.npz", timeout=120), "not what rank-00000.json")
    for change, words in ((lambda p: p.pop(q), "missing ['layers.0.query.weight']"),
                          (halve, "layers.0.query.weight: (")):
        shutil.rmtree(sharded_run)
        shutil.copytree(sharded_template, sharded_run)
        edit_with_manifest(ckpt, change)
        one_line(hvd("convert", ckpt, "--output", tmp_path / "w.npz", timeout=120),
                 "does not match its run's bert_config.json", words)
        assert not (tmp_path / "w.npz").exists()
    text = (ckpt / "index.json").read_text()
    (ckpt / "index.json").write_text(text[:-1] + ', "x": ' + "[" * 100000 + "]" * 100000 + "}")
    one_line(hvd("convert", ckpt, "--output", tmp_path / "w.npz", timeout=120), "is not an index of")
    assert not (tmp_path / "w.npz").exists()


def test_convert_never_replaces_a_runs_files(sharded_template, finished_run, tmp_path):
    """Not another run's metrics, checkpoint, folder or a name it gives its files, --overwrite or
    not; nor an existing file without --overwrite. A new file of another name is written."""
    ckpt = the_shards(sharded_template)
    before = digests(finished_run)
    (existing := tmp_path / "w.npz").write_bytes(b"mine")
    (finished_run / "metrics.jsonl").touch()
    (own,) = sorted(finished_run.glob("ckpt-*"))
    for out, extra in ((finished_run / "metrics.jsonl", ()), (own, ("--to", "hf", "--overwrite")),
                       (finished_run, ("--to", "hf", "--overwrite")), (finished_run / "ckpt-00000009.pt", ()),
                       (finished_run / "tensorboard" / "w.npz", ())):
        one_line(hvd("convert", ckpt, "--output", out, *extra, timeout=120),
                 "convert never writes over a run's")
    one_line(hvd("convert", ckpt, "--output", existing, timeout=120), "exists: give --overwrite")
    assert existing.read_bytes() == b"mine" and digests(finished_run) == before
    res = hvd("convert", ckpt, "--output", finished_run / "export.npz", timeout=120)  # (a name of its own)
    assert res.returncode == 0 and (finished_run / "export.npz").is_file(), res.stderr


def test_launch_returns_when_its_ranks_do_though_a_child_of_theirs_runs_on(tmp_path):
    """A process a rank started and left running would keep the output pipe open (mpirun and
    horovodrun wait for it): it is ended, with a line, and the launch returns with the ranks'
    status and lines."""
    import time

    script = tmp_path / "orphan.py"
    script.write_text("import subprocess\nsubprocess.Popen(['sleep', '60'])\n"
                      "print('parent done', flush=True)\n")
    t0 = time.monotonic()
    res = hvd("launch", "-np", "2", "--", "python", script, timeout=100)
    assert res.returncode == 0 and res.stdout.count("parent done") == 2, res.stdout + res.stderr
    assert res.stderr.count("the script left 1 process running") == 2, res.stderr
    assert time.monotonic() - t0 < 50


def test_prepare_and_finetune_name_what_is_wrong_with_their_inputs(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("One sentence here. Another one there.\n\nA second document here.\n")
    one_line(hvd("prepare-bert", "--input", corpus, "--output", tmp_path / "d", "--max-seq-length", "64",
                 "--max-predictions-per-seq", "100", "--vocab", VOCAB, timeout=120),
             "max_predictions_per_seq 100 is more than the max_seq_length of 64")
    tsv = tmp_path / "train.tsv"
    tsv.write_text("sentence\tlabel\na fine film\t1\n")
    one_line(hvd("finetune", "--set", f"data={tsv}", "--set", f"train.output_dir={tmp_path / 'ft'}",
                 timeout=120), f"data {tsv} is a file, not a prepared data folder")
    assert not (tmp_path / "d").exists() and not (tmp_path / "ft").exists()


def test_an_export_takes_only_the_vocabulary_the_model_was_trained_with(sharded_template, tmp_path):
    """--vocab of another size (or not a vocabulary at all) is refused before anything is written:
    the export would load with a tokenizer whose ids are not the model's."""
    short = tmp_path / "v100.txt"
    short.write_text("".join(f"tok{i}\n" for i in range(100)))
    readme = Path(__file__).parents[2] / "README.md"
    for vocab, words in ((short, "has 100 tokens, the model 1500"), (readme, "twice")):
        one_line(hvd("convert", sharded_template, "--to", "hf", "--output", tmp_path / "hf", "--vocab", vocab,
                     timeout=120), words, "nothing was written")
        assert not (tmp_path / "hf").exists()


def test_a_preparation_never_writes_into_a_run(sharded_template, tmp_path):
    """prepare-* write a data folder, never a run folder, a checkpoint folder or a name of a run's
    files (a run's vocab.txt replaced would make predict tokenize with another vocabulary)."""
    run = tmp_path / "run"
    shutil.copytree(sharded_template, run)
    before = digests(run)
    table = tmp_path / "t.tsv"
    table.write_text("sentence\tlabel\na fine film\tpos\na dull one\tneg\n")
    for out in (run, the_shards(run), run / "tensorboard"):
        one_line(hvd("prepare-classification", table, "--output", out, "--vocab", VOCAB, "--text-a",
                     "sentence", "--label", "label", "--labels", "neg", "pos", "--overwrite", timeout=120),
                 "prepare-classification never writes over a run's")
    one_line(hvd("prepare-bert", "--input", table, "--output", run, "--vocab", VOCAB, "--overwrite",
                 timeout=120), "prepare-bert never writes over a run's")
    assert digests(run) == before


def test_convert_refuses_a_checkpoint_whose_name_says_another_step(sharded_run, tmp_path):
    """A checkpoint folder renamed to another step is refused by convert as by a resume."""
    ckpt = the_shards(sharded_run)
    moved = ckpt.with_name("ckpt-00000009.shards")
    ckpt.rename(moved)
    one_line(hvd("convert", sharded_run, "--output", tmp_path / "w.npz", timeout=120),
             "says step 2, its folder's name step 9")
    assert not (tmp_path / "w.npz").exists()


def test_a_random_state_that_does_not_restore_is_a_damaged_checkpoint(sharded_run, bert_data):
    """Each rank's saved random state goes back into its framework's generator: a state of the
    wrong length is one line naming the checkpoint, not a traceback."""
    edit(the_shards(sharded_run) / "index.json",
         lambda i: i["meta"]["rng"][0].__setitem__("torch", [1, 2, 3]))
    before = digests(sharded_run)
    res = pretrain(bert_data, sharded_run, "--set", "train.checkpoint_format=sharded", steps=4, timeout=120)
    one_line(res, str(the_shards(sharded_run)), "holds a random state that does not restore")
    assert digests(sharded_run) == before


def rewrite_piece(ckpt, name, change):
    """Change one tensor of a sharded checkpoint's data and its CRCs alike (as an attacker with
    write access would): the index, the manifest and the file agree."""
    import crc32c
    from safetensors.numpy import load_file, save_file

    shard = ckpt / "rank-00000.safetensors"
    tensors = load_file(shard)
    index = json.loads((ckpt / "index.json").read_text())
    key = next(k for k, e in index["files"][shard.name]["pieces"].items() if e["name"] == name)
    tensors[key] = change(tensors[key].copy())
    save_file(tensors, shard)
    crc = f"{crc32c.crc32c(tensors[key].reshape(-1).view('uint8')):08x}"
    edit(ckpt / "index.json", lambda i: i["files"][shard.name].update(
        bytes=shard.stat().st_size, pieces={**i["files"][shard.name]["pieces"],
                                            key: {**i["files"][shard.name]["pieces"][key], "crc32c": crc}}))
    edit(ckpt / "rank-00000.json", lambda m: m["pieces"][key].update(crc32c=crc))


def test_a_resume_refuses_weights_that_are_not_finite(sharded_run, bert_data):
    """A checkpoint whose weights hold NaN (its CRCs made to agree) is named as damaged at the
    resume, not blamed on the run diverging 50 steps later."""
    import numpy as np

    def poison(a):
        a.reshape(-1)[0] = np.nan
        return a
    rewrite_piece(the_shards(sharded_run), "model/layers.0.query.weight", poison)
    before = digests(sharded_run)
    res = pretrain(bert_data, sharded_run, "--set", "train.checkpoint_format=sharded", steps=4, timeout=120)
    one_line(res, "holds NaN or infinite values (layers.0.query.weight)", "delete it")
    assert digests(sharded_run) == before


def test_a_head_of_another_shape_is_refused_by_convert_and_init_checkpoint(sharded_run, bert_data, tmp_path):
    """Every tensor the run's bert_config.json describes is checked, the pretraining heads too: a
    masked-LM bias of another shape is not exported (it would not load in transformers), and an
    .npz holding one is one line as init_checkpoint."""
    import numpy as np

    from hvd_bert.weights.portable import read_weights, save_weights

    ckpt = the_shards(sharded_run)
    assert hvd("convert", ckpt, "--output", tmp_path / "base.npz", timeout=120).returncode == 0
    arrays, config = read_weights(tmp_path / "base.npz")
    arrays["mlm_bias"] = arrays["mlm_bias"].reshape(-1, 2)
    save_weights(tmp_path / "bad.npz", arrays, config)
    one_line(pretrain(bert_data, tmp_path / "r", "--set", f"init_checkpoint={tmp_path / 'bad.npz'}",
                      timeout=120), "mlm_bias")
    rows = len(arrays["mlm_bias"])
    rewrite_piece(ckpt, "model/mlm_bias", lambda a: a.reshape(-1, 2))
    edit_with_manifest(ckpt, lambda p: next(e for e in p.values() if e["name"] == "model/mlm_bias").update(
        shape=[rows, 2]))
    for args in (("--output", tmp_path / "w.npz"), ("--to", "hf", "--output", tmp_path / "hf")):
        one_line(hvd("convert", ckpt, *args, timeout=120), "does not match its run's bert_config.json",
                 "mlm_bias")
    assert not (tmp_path / "w.npz").exists() and not (tmp_path / "hf").exists()
    base = read_weights(tmp_path / "base.npz")[0]["mlm_bias"]
    assert np.array_equal(base.reshape(-1, 2), arrays["mlm_bias"])  # (the inputs were left as they were)


def test_a_zero_bucket_too_small_for_the_model_is_refused(bert_data, tmp_path):
    """train.zero.bucket_mb cuts the model into buckets, each a collective of every step: a size
    that makes a step of millions is one line with the least that works, not a stall."""
    one_line(pretrain(bert_data, tmp_path / "r", "--set", "train.zero.stage=2", "--set",
                      "train.zero.bucket_mb=1e-300", timeout=120),
             "train.zero.bucket_mb=1e-300", "give at least")


def test_a_preparation_that_fails_leaves_its_output_as_it_was(mount_point, tmp_path):
    """A full disk halfway through prepare-classification writes nothing into --output (the
    vocabulary included): the data set is staged beside it and moved in whole."""
    disk = mount_point("-t", "tmpfs", "-o", "size=1m", "tmpfs")
    table = tmp_path / "t.tsv"
    table.write_text("sentence\tlabel\n" + "".join(f"sentence number {i} with a few words\tpos\n"
                                                    for i in range(20000)))
    res = hvd("prepare-classification", table, "--output", disk / "cls", "--vocab", VOCAB, "--text-a",
              "sentence", "--label", "label", timeout=120)
    one_line(res, "no space left")
    assert list(disk.iterdir()) == []


# ---------------------------------------------------------------- the second fresh round's cases

@pytest.mark.parametrize("key, target", [("timeline", "dataset.json"), ("autotune_log", "vocab.txt")])
def test_horovods_own_files_never_over_the_jobs_inputs(key, target, bert_data, tmp_path):
    """train.horovod.timeline and autotune_log are outputs: over a file of the data they are
    refused before Horovod starts, the data byte-identical and no run folder made."""
    before = digests(bert_data)
    extra = ("--set", "train.horovod.autotune=true") if key == "autotune_log" else ()
    one_line(pretrain(bert_data, tmp_path / "r", *extra, "--set", f"train.horovod.{key}={bert_data / target}",
                      timeout=120), f"train.horovod.{key}", "which this command reads")
    assert digests(bert_data) == before and not (tmp_path / "r").exists()


def resigned(ckpt_file, change):
    """A consolidated checkpoint changed and signed again (its digest recomputed), as an attacker
    with write access would."""
    import torch

    from hvd_bert.pt.checkpoint import state_digest

    ckpt = torch.load(ckpt_file, weights_only=True)
    change(ckpt)
    meta = json.loads(ckpt["meta"])
    meta["digest"] = state_digest({k: ckpt[k] for k in ("model", "optimizer", "scaler")})
    ckpt["meta"] = json.dumps(meta)
    torch.save(ckpt, ckpt_file)


@pytest.mark.parametrize("change, words", [
    (lambda c: [st.__setitem__("step", st["step"] * 0 - 5) for st in c["optimizer"]["state"].values()],
     "step count is -5.0, not a count from 0 to its step 2"),
    (lambda c: c["optimizer"]["state"].pop(next(iter(c["optimizer"]["state"]))), "has no state"),
])
def test_a_consolidated_checkpoints_optimizer_state_is_checked_before_use(change, words, finished_run,
                                                                           bert_data):
    """The optimizer state of a .pt checkpoint whose digest was made to agree: step counts and a
    state for every parameter, checked before anything is broadcast (one line, not Horovod's
    shape mismatch or a math domain error)."""
    (ckpt,) = sorted(finished_run.glob("ckpt-*.pt"))
    resigned(ckpt, change)
    before = digests(finished_run)
    one_line(pretrain(bert_data, finished_run, steps=4, timeout=120), str(ckpt),
             "holds an optimizer state that does not fit", words)
    assert digests(finished_run) == before


def test_an_index_claiming_more_updates_than_steps_is_refused(sharded_run, tmp_path):
    edit(the_shards(sharded_run) / "index.json", lambda i: i["meta"].__setitem__("optimizer_step", 10**6))
    one_line(hvd("convert", the_shards(sharded_run), "--output", tmp_path / "w.npz", timeout=120),
             "optimizer_step 1000000 is more updates than its 2 steps applied")


def test_evaluate_squad_given_a_folder_and_prepare_squad_with_no_stride(tmp_path):
    one_line(hvd("evaluate-squad", tmp_path, tmp_path, timeout=60), f"{tmp_path} is a folder")
    for option in ("--doc-stride", "--max-query-length"):
        one_line(hvd("prepare-squad", "--input", tmp_path / "x.json", "--output", tmp_path / "o", "--vocab",
                     VOCAB, option, "0", timeout=60), f"argument {option}: 0 is not a count")
    assert not (tmp_path / "o").exists()


def test_prepare_ncf_on_a_full_disk_leaves_nothing(mount_point):
    disk = mount_point("-t", "tmpfs", "-o", "size=1m", "tmpfs")
    one_line(hvd("prepare-ncf", "--output", disk / "ncf", timeout=120), "no space left")
    assert list(disk.iterdir()) == []


# ---------------------------------------------------------------------- the third fresh round's cases
def test_a_resume_takes_the_optimizers_settings_from_the_config_not_the_checkpoint(finished_run, bert_data,
                                                                                    tmp_path):
    """A .pt checkpoint's param_groups (betas 1.5, weight decay -100, eps 0), re-signed: the resume
    trains with the run's own settings, exactly as from the untampered file."""
    import numpy as np
    import torch

    clean = tmp_path / "clean"
    shutil.copytree(finished_run, clean)
    (ckpt,) = sorted(finished_run.glob("ckpt-*.pt"))

    def tamper(c):
        for g in c["optimizer"]["param_groups"]:
            g.update(betas=(1.5, 0.999), weight_decay=-100.0, eps=0.0)
    resigned(ckpt, tamper)
    for run in (finished_run, clean):
        res = pretrain(bert_data, run, steps=4, timeout=180)
        assert res.returncode == 0, res.stderr[-2000:]
    got, want = (torch.load(sorted(r.glob("ckpt-*.pt"))[-1], weights_only=True)
                 for r in (finished_run, clean))
    assert got["optimizer"]["param_groups"] == want["optimizer"]["param_groups"]
    assert all(np.array_equal(got["model"][k].numpy(), want["model"][k].numpy()) for k in want["model"])


def test_a_preparation_refuses_counts_that_leave_no_text(tmp_path):
    table = tmp_path / "t.tsv"
    table.write_text("sentence\tlabel\na fine film\tpos\na dull one\tneg\n")
    for flag, value, words in (("--max-seq-length", "1", "is not a count from 3 to 65536"),
                               ("--max-seq-length", "0", "is not a count from 3 to 65536"),
                               ("--num-shards", "0", "is not a count from 1 to")):
        one_line(hvd("prepare-classification", table, "--output", tmp_path / "c", "--vocab", VOCAB,
                     "--text-a", "sentence", "--label", "label", flag, value, timeout=60), flag, words)
    twice = tmp_path / "twice.tsv"
    twice.write_text("sentence\tsentence\tlabel\na\tb\tpos\n")
    one_line(hvd("prepare-classification", twice, "--output", tmp_path / "c", "--vocab", VOCAB, "--text-a",
                 "sentence", "--label", "label", timeout=60), "names the column 'sentence' more than once")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("glue, words", [("stsb", "glue_task 'stsb' is a regression task"),
                                         ("foo", "glue_task 'foo' is not one of"),
                                         (5, "glue_task 5 is not one of")])
def test_a_task_record_naming_another_glue_task_is_damage(glue, words, sharded_finetune, tmp_path):
    run = tmp_path / "ft"
    shutil.copytree(sharded_finetune[0], run)
    edit(run / "task.json", lambda t: t.__setitem__("glue_task", glue))
    table = tmp_path / "in.tsv"
    table.write_text("sentence\ngood value returns 1\n")
    one_line(hvd("predict", run, table, "--output", tmp_path / "p.jsonl", timeout=120),
             "task.json is damaged", words)
    edit(run / "task.json", lambda t: (t.__setitem__("glue_task", None),
                                       t.__setitem__("labels", ["neg", "pos\u202e"])))
    one_line(hvd("predict", run, table, "--output", tmp_path / "p.jsonl", timeout=120), "do not print")
    assert not (tmp_path / "p.jsonl").exists()


@pytest.mark.parametrize("value", ['"0.5"', "NaN", "null", "true"])
def test_evaluate_squad_refuses_no_answer_probabilities_that_are_not_numbers(value, tmp_path):
    context = "The note was written by Ada Lovelace in 1843."
    data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": "q0", "question": "Who?", "is_impossible": False,
         "answers": [{"text": "Ada Lovelace", "answer_start": 24}]}]}]}]}
    (tmp_path / "d.json").write_text(json.dumps(data))
    (tmp_path / "p.json").write_text(json.dumps({"q0": "Ada Lovelace"}))
    (tmp_path / "na.json").write_text(f'{{"q0": {value}}}')
    one_line(hvd("evaluate-squad", tmp_path / "d.json", tmp_path / "p.json", "--na-prob",
                 tmp_path / "na.json", timeout=60), "na.json", "not a finite number")


def test_ncf_refuses_a_bert_run_as_its_trained_model(finished_run, tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    (tmp_path / "ratings.dat").write_text("".join(
        f"{u}::{i}::4::{t}\n" for t, (u, i) in enumerate(sorted({(int(u), int(i)) for u, i in zip(
            rng.integers(1, 40, 2000), rng.integers(1, 200, 2000))}))))
    assert hvd("prepare-ncf", "--movielens", tmp_path / "ratings.dat", "--output", tmp_path / "ncf",
               timeout=120).returncode == 0
    before = digests(finished_run)
    for extra in ((), ("--set", "train.optim.name=nvlamb")):
        one_line(hvd("ncf", "--set", f"data={tmp_path / 'ncf'}", "--set", "do_train=false", "--set",
                     f"init_checkpoint={finished_run}", *extra, timeout=120),
                 "holds a BERT checkpoint", "not an NCF model")
    assert digests(finished_run) == before


def test_a_tensorboard_that_cannot_start_is_refused_before_training(bert_data, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "tensorboard").write_text("a file where the log folder goes")
    one_line(pretrain(bert_data, run, timeout=120), "train.report_to=tensorboard", "is not a folder")
    assert sorted(p.name for p in run.iterdir()) == ["tensorboard"]


def test_an_mlflow_store_inside_the_jobs_inputs_or_a_checkpoint_is_refused(sharded_run, bert_data, tmp_path):
    import os

    before = digests(bert_data)
    ckpt = the_shards(sharded_run)
    for store, words in ((bert_data / "mlflow.db", "lies inside data"),
                         (ckpt / "mlflow.db", "lies inside the checkpoint")):
        env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{store}")
        one_line(pretrain(bert_data, sharded_run if "checkpoint" in words else tmp_path / "fresh",
                          "--set", "train.report_to=[mlflow]", steps=4, timeout=120, env=env),
                 "MLFLOW_TRACKING_URI's store", words)
        assert not store.exists()
    assert digests(bert_data) == before and not (tmp_path / "fresh").exists()


def test_a_recipe_that_writes_a_key_twice_or_a_base_60_number_is_refused(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("train:\n  optim:\n    lr: 0.001\nmodel: mini\ntrain:\n  seed: 3\n")
    one_line(hvd("config", "--job", "pretrain", "--config", twice, timeout=60), "line 5",
             "the key 'train' is written twice")
    sexagesimal = tmp_path / "s.yaml"
    sexagesimal.write_text("train:\n  seed: 1:30\n")
    one_line(hvd("config", "--job", "pretrain", "--config", sexagesimal, timeout=60), "base-60")


def test_json_and_yaml_nested_past_the_parser_are_one_line(tmp_path):
    """Thousands of levels of brackets in a JSON input, a recipe or a --set value: one line naming
    it where the reader knows the file, never a RecursionError's traceback."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "sq.json").write_text('{"version": "v1.1", "data": []}')
    (tmp_path / "p.json").write_text("{}")
    for args, words in (((tmp_path / "sq.json", deep), "predictions file"),
                        ((deep, tmp_path / "p.json"), "SQuAD data file"),
                        ((tmp_path / "sq.json", tmp_path / "p.json", "--na-prob", deep), "no-answer")):
        one_line(hvd("evaluate-squad", *args, timeout=60), words, str(deep), "maximum recursion depth")
    recipe = tmp_path / "deep.yaml"
    recipe.write_text("model: " + "[" * 5000 + "]" * 5000 + "\n")
    one_line(hvd("config", "--job", "pretrain", "--config", recipe, timeout=60), str(recipe),
             "nests its values")
    one_line(hvd("config", "--job", "pretrain", "--set", "model=" + "[" * 5000 + "]" * 5000, timeout=60),
             "--set value", "nests its values")


@pytest.mark.parametrize("args, words", [
    (("--fusion-mb", "1e-320"), "--fusion-mb: 1e-320 is not a finite number"),
    (("--params", "100", "--tensors", "200", "--micro-batch-seconds", "1", "--samples", "1"),
     "--tensors 200 is more tensors than the model's 100 --params"),
    (("--params", "1e6", "--micro-batch-seconds", "1e-320"), "--micro-batch-seconds: 1e-320"),
    (("--model-size", "--device-gb", "5e-324"), "--device-gb: 5e-324")])
def test_simulate_refuses_sizes_below_a_byte_and_more_tensors_than_parameters(args, words):
    one_line(hvd("simulate", "--gpus", "8", *args, timeout=60), words)


def test_predict_never_writes_over_another_runs_files_or_prepared_data(sharded_finetune, finished_run,
                                                                       bert_data, tmp_path):
    run, table = sharded_finetune
    (ckpt,) = sorted(finished_run.glob("ckpt-*.pt"))
    before = (digests(finished_run), digests(bert_data))
    for out, words in ((ckpt, "is a checkpoint"), (finished_run / "config.json", "of the run folder"),
                       (finished_run / "metrics.jsonl", "of the run folder"),
                       (bert_data / "vocab.txt", "of the prepared data folder")):
        one_line(hvd("predict", run, table, "--output", out, timeout=120), str(out), words)
    assert (digests(finished_run), digests(bert_data)) == before


def test_a_task_record_whose_sequence_holds_no_text_is_damage(sharded_finetune, tmp_path):
    run, table = sharded_finetune
    copy = tmp_path / "ft"
    shutil.copytree(run, copy)
    edit(copy / "task.json", lambda t: t.__setitem__("max_seq_length", 1))
    one_line(hvd("predict", copy, table, "--output", tmp_path / "p.jsonl", timeout=120),
             "task.json is damaged", "leaves no room for text")


def test_a_data_check_that_fails_after_the_start_leaves_no_run_folder(sharded_finetune, sharded_template,
                                                                      tmp_path):
    """The features' sizes are checked when the first batch is read, after the run folder was
    made: the refusal takes the folder back (nothing was trained in it)."""
    data = tmp_path / "cls"
    shutil.copytree(sharded_finetune[0].parent / "cls", data)
    edit(data / "dataset.json", lambda d: d.__setitem__("max_seq_length", 64))
    out = tmp_path / "ft"
    one_line(hvd("finetune", "--set", f"data={data}", "--set", f"init_checkpoint={sharded_template}", "--set",
                 "train.schedule.total_steps=2", "--set", "epochs=0", "--set", f"train.output_dir={out}",
                 timeout=180), "has 32 values, expected 64")
    assert not out.exists()


def test_label_maps_in_prepared_data_are_one_to_one(sharded_finetune, sharded_template, tmp_path):
    import numpy as np

    data = tmp_path / "cls"
    shutil.copytree(sharded_finetune[0].parent / "cls", data)
    edit(data / "dataset.json", lambda d: d.__setitem__("labels", ["neg", "neg"]))
    one_line(hvd("finetune", "--set", f"data={data}", "--set", f"init_checkpoint={sharded_template}", "--set",
                 f"train.output_dir={tmp_path / 'ft'}", timeout=180), "the label 'neg' names outputs 0 and 1")
    rng = np.random.default_rng(0)
    (tmp_path / "ratings.dat").write_text("".join(
        f"{u}::{i}::4::{t}\n" for t, (u, i) in enumerate(sorted({(int(u), int(i)) for u, i in zip(
            rng.integers(1, 40, 2000), rng.integers(1, 200, 2000))}))))
    ncf = tmp_path / "ncf"
    assert hvd("prepare-ncf", "--movielens", tmp_path / "ratings.dat", "--output", ncf,
               timeout=120).returncode == 0
    with np.load(ncf / "ncf.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["item_ids"][1] = arrays["item_ids"][0]
    with open(ncf / "ncf.npz", "wb") as f:  # (the same size: the sidecar's byte count holds)
        np.savez(f, **arrays)
    one_line(hvd("ncf", "--set", f"data={ncf}", "--set", f"train.output_dir={tmp_path / 'run'}", timeout=120),
             "one input id for two indices")
    arrays["item_ids"][1] += 10**6
    arrays["test_negatives"][5, 3] = arrays["test_items"][5]  # (a negative that is the held-out positive)
    with open(ncf / "ncf.npz", "wb") as f:
        np.savez(f, **arrays)
    one_line(hvd("ncf", "--set", f"data={ncf}", "--set", f"train.output_dir={tmp_path / 'run'}", timeout=120),
             "user 5's test negatives hold its held-out item")
    assert not (tmp_path / "ft").exists() and not (tmp_path / "run").exists()


def squad_file(path, questions):
    context = ("The note was written by Ada Lovelace in 1843. It describes an algorithm for the "
               "Analytical Engine of Charles Babbage.")
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": questions}]}]}))
    return path


def question(i, answers=True, text="Ada Lovelace"):
    return {"id": i, "question": "Who wrote the note?",
            "answers": [{"text": text, "answer_start": 24}] if answers else []}


def test_squad_files_with_colliding_ids_empty_answers_or_half_answered_are_refused(bert_data, tmp_path):
    vocab = bert_data / "vocab.txt"
    for questions, words in (([question(7), question("7")], "question id '7' is given twice"),
                             ([question("a", text=""), question("b")], "answers[0].text is empty"),
                             ([question("a"), question("b", answers=False)], "has no answers while")):
        src = squad_file(tmp_path / "sq.json", questions)
        one_line(hvd("prepare-squad", "--input", src, "--vocab", vocab, "--output", tmp_path / "out",
                     "--split", "dev", timeout=120), str(src), words)
        assert not (tmp_path / "out").exists()
    (tmp_path / "p.json").write_text(json.dumps({"a": "Ada Lovelace", "b": "Ada Lovelace"}))
    one_line(hvd("evaluate-squad", tmp_path / "sq.json", tmp_path / "p.json", timeout=60),
             "has no answers while")


@pytest.mark.parametrize("damage, words", [
    (lambda d: (d / "examples.jsonl").unlink(), "examples.jsonl cannot be read"),
    (lambda d: edit_lines(d / "features.jsonl", lambda f: f["token_to_orig_map"].update(
        {k: v + 1000 for k, v in f["token_to_orig_map"].items()})), "maps token"),
    (lambda d: edit_lines(d / "features.jsonl", lambda f: f.__setitem__("example_index", 99)),
     "example_index 99"),
    (lambda d: (d / "features.jsonl").write_text((d / "features.jsonl").read_text().splitlines()[0] + "\n"),
     "features and"),
    (lambda d: edit_lines(d / "examples.jsonl", lambda e: e.__setitem__("qas_id", "same")),
     "is missing or repeated"),
])
def test_the_prediction_files_of_prepared_squad_data_are_checked(damage, words, bert_data, tmp_path):
    from hvd_bert.data.records import DatasetError
    from hvd_bert.data.sidecar import read_sidecar
    from hvd_bert.data.squad import read_side_files

    src = squad_file(tmp_path / "sq.json", [question(f"q{i}") for i in range(4)])
    dev = tmp_path / "dev"
    assert hvd("prepare-squad", "--input", src, "--vocab", bert_data / "vocab.txt", "--output", dev,
               "--split", "dev", timeout=120).returncode == 0
    meta = read_sidecar(dev, "bert-squad")
    read_side_files(dev, meta)  # (as prepared: whole)
    damage(dev)
    with pytest.raises(DatasetError, match=words):
        read_side_files(dev, meta)


def edit_lines(path, change):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        change(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_convert_never_replaces_prepared_data_and_finetune_checks_its_sidecar_first(
        finished_run, bert_data, sharded_template, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(bert_data, data)
    before = digests(data)
    for out in (data, f"{data}/"):
        one_line(hvd("convert", finished_run, "--to", "hf", "--output", out, "--overwrite", timeout=120),
                 "is prepared data", "--overwrite or not")
    assert digests(data) == before
    src = squad_file(tmp_path / "sq.json", [question(f"q{i}") for i in range(4)])
    train = tmp_path / "train"
    assert hvd("prepare-squad", "--input", src, "--vocab", bert_data / "vocab.txt", "--output", train,
               timeout=120).returncode == 0
    for key, value, words in (("doc_stride", 0, "doc_stride 0 is not a count"),
                              ("is_training", "yes", "is_training is 'yes', not true or false")):
        good = json.loads((train / "dataset.json").read_text())[key]
        edit(train / "dataset.json", lambda d, k=key, v=value: d.__setitem__(k, v))
        one_line(hvd("finetune", "--set", f"data={train}", "--set", f"init_checkpoint={sharded_template}",
                     "--set", f"train.output_dir={tmp_path / 'ft'}", timeout=180), "dataset.json", words)
        edit(train / "dataset.json", lambda d, k=key, v=good: d.__setitem__(k, v))
    assert not (tmp_path / "ft").exists()


def test_record_values_past_the_sidecars_labels_or_vocabulary_are_refused_before_training(bert_data,
                                                                                          sharded_template,
                                                                                          tmp_path):
    """A NER set whose dataset.json lists fewer tags than its records use (PyTorch's 'Target 3 is
    out of bounds' traceback mid-run), or fewer vocabulary tokens than its ids reach: one line
    naming the shard, and no run folder."""
    conll = tmp_path / "ner.txt"
    conll.write_text("EU B-ORG\nrejects O\nGerman B-MISC\ncall O\n\nPeter B-PER\nBlackburn I-PER\n\n"
                     "BRUSSELS B-LOC\n\nThe O\nEuropean B-ORG\nCommission I-ORG\n\n")
    data = tmp_path / "ner"
    assert hvd("prepare-token-classification", conll, "--output", data, "--vocab", bert_data / "vocab.txt",
               "--max-seq-length", "32", timeout=120).returncode == 0
    good = json.loads((data / "dataset.json").read_text())
    for key, value, words in (("labels", good["labels"][:2], "outside the 2 labels"),
                              ("vocab_size", 5, "outside the 5 tokens")):
        edit(data / "dataset.json", lambda d, k=key, v=value: d.__setitem__(k, v))
        one_line(hvd("finetune", "--set", f"data={data}", "--set", f"init_checkpoint={sharded_template}",
                     "--set", f"train.output_dir={tmp_path / 'ft'}", timeout=180), ".tfrecord", words)
        edit(data / "dataset.json", lambda d, k=key, v=good[key]: d.__setitem__(k, v))
    assert not (tmp_path / "ft").exists()
