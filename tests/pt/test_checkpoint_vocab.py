"""The checkpoint's tokenizer is the tokenizer: --vocab as a vocab.txt, a Hugging Face
tokenizer.json (written by transformers' own tokenizer) or a checkpoint folder; the case from
the checkpoint; a vocabulary that does not belong to the checkpoint refused."""

import json
import os
import subprocess
import sys

import pytest

transformers = pytest.importorskip("transformers")

from hvd_bert.data.records import DatasetError  # noqa: E402
from hvd_bert.data.vocab import resolve_vocab  # noqa: E402

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "file", "is", "open", "closed", "##s", "a", "b"]


def hf_tokenizer_folder(tmp_path, lower, name="tok"):
    vocab = tmp_path / f"{name}-vocab.txt"
    vocab.write_text("\n".join(WORDS) + "\n")
    tok = transformers.BertTokenizerFast(vocab={w: i for i, w in enumerate(WORDS)}, do_lower_case=lower)
    out = tmp_path / name
    tok.save_pretrained(out)
    if not (out / "vocab.txt").is_file():  # transformers 5 writes tokenizer.json only
        (out / "vocab.txt").write_text(vocab.read_text())
    (out / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": len(WORDS)}))
    return out


@pytest.mark.parametrize("lower", [True, False])
def test_a_tokenizer_json_alone_gives_the_same_vocab_and_case(tmp_path, lower):
    folder = hf_tokenizer_folder(tmp_path, lower)
    (folder / "vocab.txt").unlink()
    (folder / "tokenizer_config.json").unlink()
    got = resolve_vocab(folder / "tokenizer.json")
    assert got.path.read_text().splitlines() == WORDS and got.do_lower_case is lower


@pytest.mark.parametrize("lower", [True, False])
def test_a_checkpoint_folder_gives_its_vocab_and_case(tmp_path, lower):
    got = resolve_vocab(hf_tokenizer_folder(tmp_path, lower))
    assert got.path.read_text().splitlines() == WORDS and got.do_lower_case is lower


def test_googles_folder_name_says_the_case(tmp_path):
    folder = tmp_path / "cased_L-2_H-128_A-2"
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    (folder / "bert_config.json").write_text(json.dumps({"vocab_size": len(WORDS)}))
    assert resolve_vocab(folder).do_lower_case is False


def test_a_vocab_that_does_not_belong_to_the_checkpoint_is_refused(tmp_path):
    folder = hf_tokenizer_folder(tmp_path, True)
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 30522}))
    with pytest.raises(DatasetError, match=r"has 13 tokens but .*config.json says vocab_size 30522"):
        resolve_vocab(folder)
    (folder / "vocab.txt").write_text("a\nb\n")
    with pytest.raises(DatasetError, match="lacks BERT's special tokens"):
        resolve_vocab(folder / "vocab.txt")


def test_prepare_classification_takes_the_checkpoint_folder_and_its_case(tmp_path):
    folder = hf_tokenizer_folder(tmp_path, False)
    table = tmp_path / "t.tsv"
    table.write_text("sentence\tlabel\nThe file is open\tyes\nthe files closed\tno\n")
    res = subprocess.run([sys.executable, "-m", "hvd_bert", "prepare-classification", str(table), "--output",
                          str(tmp_path / "out"), "--vocab", str(folder), "--text-a", "sentence", "--label",
                          "label", "--num-shards", "1"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "keeping case, as the checkpoint of" in res.stdout
    meta = json.loads((tmp_path / "out" / "dataset.json").read_text())
    assert meta["vocab_size"] == len(WORDS) and meta.get("do_lower_case") is False


def test_a_tokenizer_json_leaves_no_temporary_vocab_behind(tmp_path):
    """The vocab.txt written from a tokenizer.json lives in a temporary folder for the one
    process; prepare-classification copies it into its output, and the folder is gone after."""
    folder = hf_tokenizer_folder(tmp_path, True)
    (folder / "vocab.txt").unlink()
    table = tmp_path / "t.tsv"
    table.write_text("sentence\tlabel\nThe file is open\tyes\nthe files closed\tno\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    res = subprocess.run([sys.executable, "-m", "hvd_bert", "prepare-classification", str(table), "--output",
                          str(tmp_path / "out"), "--vocab", str(folder / "tokenizer.json"), "--text-a",
                          "sentence", "--label", "label", "--num-shards", "1"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "TMPDIR": str(tmp)})
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "out" / "vocab.txt").read_text().splitlines() == WORDS
    assert not list(tmp.glob("hvd_bert-vocab-*"))
