"""Evaluation, framework-free: the official metrics and which records each rank scores.

    squad     the official SQuAD v1.1 / v2.0 exact match and F1
    finetune  exact evaluation of classification, regression and SQuAD across ranks; pretraining's
              held-out masked-LM and next-sentence scores
    ncf       HR@K and NDCG@K over sampled negatives (He et al. 2017, MLPerf)
"""
