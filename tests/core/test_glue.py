"""GLUE: each task's published TSV layout, and the metrics against scikit-learn and SciPy (what
the GLUE baselines and Hugging Face's glue metric compute them with)."""

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import f1_score, matthews_corrcoef

from hvd_bert.data import glue as G
from hvd_bert.evaluation import glue as M
from hvd_bert.data.records import DatasetError


@pytest.mark.parametrize("seed", range(10))
def test_metrics_equal_scikit_learn_and_scipy(seed):
    rng = np.random.default_rng(seed)
    for labels in (2, 3):
        gold = rng.integers(0, labels, 200)
        pred = np.where(rng.random(200) < 0.7, gold, rng.integers(0, labels, 200))
        cm = M.confusion(pred, gold, labels)
        assert cm.sum() == 200 and M.accuracy(cm) == pytest.approx((pred == gold).mean())
        assert M.matthews(cm) == pytest.approx(matthews_corrcoef(gold, pred))
        if labels == 2:
            assert M.f1_binary(cm) == pytest.approx(f1_score(gold, pred))
    x = rng.normal(size=100)
    y = np.round(x + rng.normal(size=100), 1)  # rounded: ties for Spearman
    assert M.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
    assert M.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])


def test_confusion_matrices_summed_over_ranks_give_the_whole_sets_metric():
    rng = np.random.default_rng(0)
    gold, pred = rng.integers(0, 2, 101), rng.integers(0, 2, 101)
    parts = [M.confusion(pred[r::3], gold[r::3], 2) for r in range(3)]
    assert M.matthews(sum(parts)) == pytest.approx(matthews_corrcoef(gold, pred))
    assert M.matthews(np.array([[5, 0], [0, 0]])) == 0.0  # undefined: 0, as scikit-learn says


def test_each_task_layout():
    cola = [["gj04", "1", "", "Our friends won't buy this analysis."],
            ["gj04", "0", "*", "They drank the pub."]]
    assert G.read_task("cola", cola, "train.tsv") == (
        ["Our friends won't buy this analysis.", "They drank the pub."], None, ["1", "0"])
    mrpc = [["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"], ["1", "7", "8", "He said.", "He told."]]
    assert G.read_task("mrpc", mrpc, "train.tsv") == (["He said."], ["He told."], ["1"])
    stsb = [["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1",
             "sentence2", "score"], ["0", "main-captions", "MSRvid", "2012test", "0001", "none", "none",
                                     "A plane is taking off.", "An air plane is taking off.", "5.000"]]
    assert G.read_task("stsb", stsb, "train.tsv") == (["A plane is taking off."],
                                                     ["An air plane is taking off."], ["5.000"])
    mnli_header = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
                   "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1", "sentence2",
                   "label1", "label2", "label3", "label4", "label5", "gold_label"]
    row = ["0", "1", "2", "fiction", "(", "(", "(", "(", "He ran.", "He moved.", "entailment", "neutral",
           "entailment", "entailment", "entailment", "entailment"]
    assert G.read_task("mnli", [mnli_header, row], "dev_matched.tsv") == (["He ran."], ["He moved."],
                                                                          ["entailment"])
    with pytest.raises(DatasetError, match=r"train.tsv line 2 has 2 columns; the mrpc layout needs 5"):
        G.read_task("mrpc", [mrpc[0], ["1", "x"]], "train.tsv")
    with pytest.raises(DatasetError, match=r"labels \['maybe'\] are not rte's"):
        G.read_task("rte", [["index", "sentence1", "sentence2", "label"], ["0", "a", "b", "maybe"]],
                    "dev.tsv")
    assert set(G.TASKS) == {"cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"}
