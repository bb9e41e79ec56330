"""What a fine-tuned model predicts travels with it (task.json in its run folder, id2label in a
Hugging Face export), and a prediction run on data with another task or other labels is refused
naming both and the fix."""

import json

from hvd_bert.data.finetune import TASK_FILE, prediction_mismatch, read_task_record, task_record

TRAIN = {"kind": "bert-classification", "labels": ["neg", "pos"], "regression": False}


def test_a_run_folders_record_and_a_matching_set(tmp_path):
    (tmp_path / TASK_FILE).write_text(json.dumps(task_record(TRAIN)))
    rec = read_task_record(tmp_path)
    assert (rec["task"], rec["labels"], rec["glue_task"]) == ("classification", ["neg", "pos"], None)
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


class _Log:
    def __init__(self):
        self.lines, self.records = [], []

    def print(self, line):
        self.lines.append(line)

    def record(self, rec, prefix="train", show=True):
        self.records.append(rec)


class _Step:
    def __init__(self, step):
        self.step = step


def test_the_best_model_is_kept_and_early_stopping_waits_its_patience():
    from hvd_bert.config import FinetuneConfig, load_config
    from hvd_bert.evaluation.finetune import Evaluation, best_metric_of

    cfg = load_config(FinetuneConfig, None, ["eval_data=dev", "eval_every=10", "early_stopping_patience=2"])
    assert best_metric_of(cfg, "classification", None) == "eval_accuracy"
    assert best_metric_of(cfg, "classification", "cola") == "eval_mcc"
    assert best_metric_of(cfg, "squad", None) == "eval_f1"
    scores = iter([0.5, 0.6, 0.55, 0.6, 0.9])
    saved, log = [], _Log()
    ev = Evaluation(cfg, 100, log, lambda: {"eval_accuracy": next(scores), "eval_examples": 8},
                    metric="eval_accuracy",
                    save_best=lambda step, res: saved.append((step, res["eval_accuracy"])))
    stops = [ev(_Step(s)) for s in (10, 20, 30, 40)]
    assert stops == [False, False, False, True]  # 0.55 and 0.6 do not beat 0.6: two in a row
    assert saved == [(10, 0.5), (20, 0.6)] and ev.best == (0.6, 20)
    assert "early stopping at step 40: eval_accuracy has not improved on 0.6000 (step 20)" in log.lines[-1]
    assert ev.report(40)["eval_accuracy"] == 0.6  # the step just evaluated is not evaluated again
    assert [r["step"] for r in log.records] == [10, 20, 30, 40]


def test_a_best_metric_the_task_does_not_have_is_named():
    import pytest

    from hvd_bert.config import ConfigError, FinetuneConfig, load_config
    from hvd_bert.evaluation.finetune import Evaluation

    cfg = load_config(FinetuneConfig, None, ["eval_data=dev", "eval_every=10", "best_metric=eval_f2"])
    ev = Evaluation(cfg, 100, _Log(), lambda: {"eval_accuracy": 0.5, "eval_examples": 8}, metric="eval_f2")
    with pytest.raises(ConfigError, match=r"best_metric 'eval_f2' is not among this task's scores"):
        ev(_Step(10))


def test_a_loss_is_better_smaller_and_the_best_model_is_the_smallest_loss():
    """best_metric=eval_loss: 0.6911 -> 0.6845 -> 0.6848 keeps step 20 (the walkthrough's run
    kept the worst, step 10); early stopping counts the evaluations without a smaller one; an
    unknown name asks for greater_is_better, which then decides."""
    import pytest

    from hvd_bert.config import ConfigError, FinetuneConfig, load_config
    from hvd_bert.evaluation.direction import greater_is_better
    from hvd_bert.evaluation.finetune import Evaluation

    losses = iter([0.6911, 0.6845, 0.6848, 0.6850])
    saved = []
    cfg = load_config(FinetuneConfig, None, ["eval_data=dev", "eval_every=10", "best_metric=eval_loss",
                                             "early_stopping_patience=2"])
    ev = Evaluation(cfg, 100, _Log(), lambda: {"eval_loss": next(losses), "eval_examples": 8},
                    metric="eval_loss", save_best=lambda step, res: saved.append(step))
    stops = [ev(_Step(s)) for s in (10, 20, 30, 40)]
    assert ev.best == (0.6845, 20) and saved == [10, 20] and stops == [False, False, False, True]
    assert not greater_is_better("eval_loss") and not greater_is_better("eval/perplexity")
    assert greater_is_better("eval_accuracy") and greater_is_better("hr@10") and greater_is_better("eval_f1")
    with pytest.raises(ValueError, match="greater_is_better"):
        greater_is_better("eval_my_score")
    assert greater_is_better("eval_my_score", False) is False
    cfg = load_config(FinetuneConfig, None, ["eval_data=dev", "eval_every=10", "best_metric=eval_mine"])
    ev = Evaluation(cfg, 100, _Log(), lambda: {"eval_mine": 1.0, "eval_examples": 8}, metric="eval_mine")
    with pytest.raises(ConfigError, match="set greater_is_better=true or false"):
        ev(_Step(10))


def test_a_best_metric_no_evaluation_gives_is_refused_before_training():
    """A misspelt best_metric is refused when the job starts (not after training), naming the
    scores there are; SQuAD v2.0's split scores pass."""
    import pytest

    from hvd_bert.config import ConfigError, FinetuneConfig, load_config
    from hvd_bert.evaluation.finetune import best_metric_of

    cfg = load_config(FinetuneConfig, None, ["eval_data=dev", "best_metric=eval_nonexistent"])
    with pytest.raises(ConfigError, match=r"best_metric 'eval_nonexistent' is no score of an evaluation; "
                                          r"give one of eval_accuracy"):
        best_metric_of(cfg, "classification", None)
    for name in ("eval_exact", "eval_HasAns_f1", "eval_best_f1"):
        cfg = load_config(FinetuneConfig, None, ["eval_data=dev", f"best_metric={name}"])
        assert best_metric_of(cfg, "squad", None) == name
    # another task's score: refused before training too (it had been found missing after it)
    for name, task, ok in (("eval_mcc", "classification", True), ("eval_pearson", "classification", False),
                           ("eval_accuracy", "regression", False), ("eval_spearman", "regression", True),
                           ("eval_mcc", "squad", False), ("eval_recall", "token-classification", True)):
        cfg = load_config(FinetuneConfig, None, ["eval_data=dev", f"best_metric={name}"])
        if ok:
            assert best_metric_of(cfg, task, None) == name
        else:
            with pytest.raises(ConfigError, match=f"'{name}' is not a score of {task}'s evaluation"):
                best_metric_of(cfg, task, None)
