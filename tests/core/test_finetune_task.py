"""What a fine-tuned model predicts travels with it (task.json in its run folder, id2label in a
Hugging Face export), and a prediction run on data with another task or other labels is refused
naming both and the fix."""

import json

from hvd_bert.data.finetune import TASK_FILE, prediction_mismatch, read_task_record, task_record

TRAIN = {"kind": "bert-classification", "labels": ["neg", "pos"], "regression": False}


def test_a_run_folders_record_and_a_matching_set(tmp_path):
    (tmp_path / TASK_FILE).write_text(json.dumps(task_record(TRAIN)))
    assert read_task_record(tmp_path) == {"task": "classification", "labels": ["neg", "pos"],
                                          "glue_task": None}
    assert read_task_record(tmp_path / "ckpt-00000010.pt") == read_task_record(tmp_path)  # a checkpoint in it
    assert prediction_mismatch(str(tmp_path), TRAIN, "dev") is None


def test_other_labels_or_another_task_are_refused(tmp_path):
    (tmp_path / TASK_FILE).write_text(json.dumps(task_record(TRAIN)))
    swapped = dict(TRAIN, labels=["fresh", "rotten"])
    msg = prediction_mismatch(str(tmp_path), swapped, "data/dev")
    assert "eval_data data/dev has the labels ['fresh', 'rotten']" in msg and "--labels neg pos" in msg
    assert "in that order" in prediction_mismatch(str(tmp_path), dict(TRAIN, labels=["pos", "neg"]), "d")
    regression = {"kind": "bert-classification", "regression": True}
    msg = prediction_mismatch(str(tmp_path), regression, "d")
    assert "fine-tuned for classification, eval_data d holds regression" in msg


def test_a_hugging_face_folder_says_its_labels_unless_they_are_the_defaults(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"id2label": {"0": "neg", "1": "pos"}}))
    assert read_task_record(tmp_path)["labels"] == ["neg", "pos"]
    (tmp_path / "config.json").write_text(json.dumps({"id2label": {"0": "LABEL_0", "1": "LABEL_1"}}))
    assert read_task_record(tmp_path) is None and prediction_mismatch(str(tmp_path), TRAIN, "d") is None
