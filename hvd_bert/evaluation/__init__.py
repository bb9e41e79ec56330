"""Evaluation, framework-free: the official metrics and which records each rank scores.

    squad              the official SQuAD v1.1 / v2.0 exact match and F1
    squad_predictions  answers from start/end logits, as Google's run_squad writes them
    glue               GLUE's metrics: accuracy, F1, Matthews, Pearson, Spearman
    finetune           exact evaluation of classification, regression and SQuAD across ranks
    pretraining        held-out masked-LM loss and accuracy, next-sentence accuracy
    ncf                HR@K and NDCG@K over sampled negatives (He et al. 2017, MLPerf)
    token_classification  entities as conlleval/seqeval read them; entity F1 across ranks
    direction          whether a larger or a smaller value of a metric is better
"""
