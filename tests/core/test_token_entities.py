"""Entity-level scores of token classification (hvd_bert.evaluation.token_classification)
against seqeval, the implementation the NER literature reports with, on random tag sequences in
IOB1, IOB2 and IOBES and on mixtures a model may predict (an I- after O, a type change inside
a chunk, E- without B-)."""

import numpy as np
import pytest
from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score
from seqeval.metrics.sequence_labeling import get_entities

from hvd_bert.evaluation.token_classification import entities, entity_counts, scores_of

TAGS = ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC", "B-MISC", "I-MISC"]


def random_tags(rng, n):
    return [str(rng.choice(TAGS)) for _ in range(n)]


@pytest.mark.parametrize("seed", range(20))
def test_entities_are_seqevals(seed):
    rng = np.random.default_rng(seed)
    for _ in range(50):
        tags = random_tags(rng, int(rng.integers(0, 15)))
        assert sorted(entities(tags)) == sorted(get_entities(tags)), tags


@pytest.mark.parametrize("seed", range(10))
def test_scores_are_seqevals(seed):
    rng = np.random.default_rng(100 + seed)
    gold = [random_tags(rng, int(rng.integers(1, 12))) for _ in range(40)]
    pred = [[t if rng.random() < 0.7 else str(rng.choice(TAGS)) for t in g] for g in gold]
    ours = scores_of(entity_counts(gold, pred))
    assert ours["eval_f1"] == pytest.approx(f1_score(gold, pred), abs=1e-12)
    assert ours["eval_precision"] == pytest.approx(precision_score(gold, pred), abs=1e-12)
    assert ours["eval_recall"] == pytest.approx(recall_score(gold, pred), abs=1e-12)
    assert ours["eval_accuracy"] == pytest.approx(accuracy_score(gold, pred), abs=1e-12)


def test_no_entities_score_zero_not_a_division_error():
    assert scores_of(entity_counts([["O", "O"]], [["O", "O"]]))["eval_f1"] == 0.0
