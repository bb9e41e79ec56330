"""The fourth adversarial round's tenth fresh pass, through the command line: outputs never
replace a device or a pipe (``/dev/null`` was replaced system-wide) and a file where a
folder goes (or under a path) is one line for every command; a regular expression setting that
does not compile, environment counts past their range (HVD_BERT_FOREACH_CHUNK,
OMP_NUM_THREADS), a full disk under TensorFlow's saver named as such, a W&B server that never
answers bounded in seconds with one line, empty or padded labels, SQuAD questions with no
context. Every refusal is one line with status 2, writes nothing, and leaves its inputs
byte-identical. The eleventh pass (at the end): a resume from the same folders spelt another
way; a control character in a name; NCF evaluation on other data (test_adversarial_round7.py),
k8s render's checks (tests/core/test_k8s.py) and a damaged cached kernel
(tests/pt/test_torch_kernels.py)."""

import os
import subprocess
import time

import pytest

from one_process import hvd, one_line, pretrain
from test_adversarial_round3 import digests
from test_adversarial_round4 import sharded_finetune, sharded_template  # noqa: F401  (fixtures)


@pytest.mark.parametrize("framework", ["pt", "tf"])
def test_a_setting_that_is_not_a_regular_expression_is_one_line_and_writes_nothing(bert_data, tmp_path,
                                                                                   framework):
    out = tmp_path / "run"
    res = pretrain(bert_data, out, "--framework", framework, "--set", "train.optim.exclude=['(']")
    one_line(res, "train.optim.exclude", "'(' is not a regular expression")
    assert not out.exists()


def test_outputs_never_replace_a_device_or_a_pipe_and_never_write_through_a_link(sharded_finetune, tmp_path):  # noqa: F811
    run, table = sharded_finetune
    before = digests(run, table)
    os.mkfifo(tmp_path / "fifo")
    subprocess.run(["mknod", "-m", "666", str(tmp_path / "null"), "c", "1", "3"], check=True)
    for node, kind in (("fifo", "a named pipe"), ("null", "a device")):
        for cmd in (["predict", run, table, "--output", tmp_path / node],
                    ["convert", run, "--output", tmp_path / node],
                    ["convert", run, "--output", tmp_path / node, "--overwrite"]):
            one_line(hvd(*cmd), str(tmp_path / node), kind, "not a regular file")
    assert (tmp_path / "fifo").is_fifo() and (tmp_path / "null").is_char_device()
    # a link where the output goes is replaced, never written through
    (tmp_path / "elsewhere.jsonl").write_text("kept\n")
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    assert hvd("predict", run, table, "--output", tmp_path / "link.jsonl").returncode == 0
    assert not (tmp_path / "link.jsonl").is_symlink()
    assert (tmp_path / "elsewhere.jsonl").read_text() == "kept\n"
    assert digests(run, table) == before


def test_a_file_where_a_folder_goes_is_one_line_for_every_command(sharded_finetune, bert_data,  # noqa: F811
                                                                  tmp_path):
    run, table = sharded_finetune
    before = digests(run, table)
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    os.mkfifo(tmp_path / "fifo")
    vocab = bert_data / "vocab.txt"
    cases = [
        (pretrain(bert_data, afile), [str(afile), "is a file where a folder is needed"]),
        (hvd("prepare-classification", table, "--output", afile, "--vocab", vocab, "--text-a", "sentence",
             "--label", "label"), [str(afile), "where the prepared data's folder goes"]),
        (hvd("prepare-ncf", "--synthetic", "ml-1m", "--scale", "0.02", "--output", tmp_path / "fifo"),
         ["named pipe (FIFO) where the prepared data's folder goes"]),
        (hvd("predict", run, table, "--output", afile / "x.jsonl"), [str(afile), "is a file where a folder"]),
        (hvd("convert", run, "--to", "hf", "--output", afile / "sub"), [f"{afile} is a file, not a folder"]),
        (hvd("prepare-squad", "--input", afile / "s.json", "--vocab", vocab, "--output", tmp_path / "sq"),
         [f"{afile} is a file, not a folder"]),
        (hvd("evaluate-squad", afile / "s.json", afile / "p.json"), [f"{afile} is a file, not a folder"]),
        (hvd("evaluate-squad", tmp_path / "fifo", afile), ["is not a regular file (a pipe"]),
    ]
    for res, words in cases:
        one_line(res, *words)
    assert afile.read_text() == "x\n" and (tmp_path / "fifo").is_fifo()
    assert digests(run, table) == before


@pytest.mark.parametrize("var, value, says", [
    ("HVD_BERT_FOREACH_CHUNK", "abc", "is not a chunk of elements"),
    ("HVD_BERT_FOREACH_CHUNK", "-1", "is not a chunk of elements"),
    ("OMP_NUM_THREADS", "99999999999999999999", "is not a count of threads per rank")])
def test_environment_counts_past_their_range_are_one_line(bert_data, tmp_path, var, value, says):
    out = tmp_path / "run"
    res = pretrain(bert_data, out, env=dict(os.environ, **{var: value}))
    line = one_line(res, var, says)
    assert "libgomp" not in res.stderr, line  # (refused before the framework's OpenMP reads it)
    assert not out.exists()


def test_a_full_disk_under_tensorflows_saver_is_named_as_such(sharded_finetune, mount_point):  # noqa: F811
    run, _ = sharded_finetune
    disk = mount_point("-t", "tmpfs", "-o", "size=1m", "tmpfs")
    res = hvd("convert", run, "--to", "google", "--output", disk / "g")
    one_line(res, "no space left on", str(disk / "g"))
    assert not list(disk.iterdir())


def test_a_wandb_server_that_never_answers_is_one_line_within_seconds(bert_data, tmp_path, silent_port):
    """W&B's own defaults wait 90 s to start and print their login line: the run bounds the waits
    (10 s to start, 5 s a request) and keeps the job's lines its own."""
    out = tmp_path / "run"
    env = dict(os.environ, WANDB_MODE="online", WANDB_API_KEY="0" * 40,
               WANDB_BASE_URL=f"http://127.0.0.1:{silent_port}")
    t0 = time.monotonic()
    res = pretrain(bert_data, out, "--set", "train.report_to=[wandb]", env=env)
    took = time.monotonic() - t0
    one_line(res, "train.report_to=wandb: cannot start a Weights & Biases run (online")
    assert took < 60 and not out.exists(), took  # (W&B's defaults: 109 s measured)


@pytest.mark.parametrize("rows, says", [
    ([("good", ""), ("bad", "neg")], "the label '', none"),
    ([("good", "neg "), ("bad", "neg")], "the label 'neg ', with spaces")])
def test_an_example_without_its_label_or_with_a_padded_one_is_refused(bert_data, tmp_path, rows, says):
    table = tmp_path / "t.tsv"
    table.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    res = hvd("prepare-classification", table, "--output", tmp_path / "cls", "--vocab",
              bert_data / "vocab.txt", "--text-a", "sentence", "--label", "label")
    one_line(res, f"{table}: example 1", says)
    assert not (tmp_path / "cls").exists()


@pytest.mark.parametrize("line, says", [
    ({"question": "who?", "context": ""}, "its context has no text"),
    ({"question": "who?", "context": "\u200b \u200b"}, "its context has no text"),
    ({"question": " ", "context": "a cat"}, "its question has no text"),
    ({"question": "who?", "context": "a cat", "id": ["x"]}, "its \"id\" is ['x']")])
def test_a_squad_question_without_a_context_or_with_a_list_for_its_id_is_refused(tmp_path, line, says):
    """(Read before any model loads: the reader's own refusal, in process.)"""
    import json

    from hvd_bert.data.records import DatasetError
    from hvd_bert.data.squad import read_questions

    f = tmp_path / "q.jsonl"
    f.write_text(json.dumps(line) + "\n")
    with pytest.raises(DatasetError, match="line 1") as e:
        read_questions(f)
    assert says in str(e.value)


# ----------------------------------------------------------------------------- the eleventh pass
def test_a_resume_takes_the_same_folders_spelt_another_way(bert_data, finished_run, tmp_path):
    """``data=DIR/``, ``./DIR`` or its absolute path is the folder the run recorded as ``DIR``: a
    requeue from another spelling resumes (a content check still refuses other data)."""
    spelt = f"{os.path.relpath(bert_data, tmp_path)}/"  # (relative to where it runs, trailing slash)
    res = hvd("pretrain", "--set", f"data={spelt}", "--set", "max_seq_length=64", "--set",
              "max_predictions_per_seq=10", "--set", "train.log_every=1", "--set", "progress=false", "--set",
              "train.batch.local_batch_size=8", "--set", "train.schedule.total_steps=3", "--set",
              f"train.output_dir={finished_run}", cwd=tmp_path)
    assert res.returncode == 0 and "resumed from step 2" in res.stdout, \
        res.stdout[-2000:] + res.stderr[-2000:]


def test_a_control_character_in_a_name_never_splits_the_one_line(tmp_path):
    res = hvd("evaluate-squad", tmp_path / "no\nsuch.json", tmp_path / "p.json")
    one_line(res, "no\\nsuch.json")
