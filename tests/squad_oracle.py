"""Google's reference SQuAD feature conversion (PyPI ``bert-tensorflow`` 1.0.4,
``bert/run_squad.py`` with its ``tokenization.FullTokenizer``) as an oracle, run in its own
process (its flags and TF1 imports stay out of the test process).

    python squad_oracle.py SQUAD.json VOCAB LOWER(0|1) V2(0|1) TRAIN(0|1) MAX_SEQ STRIDE MAX_QUERY OUT.json \
        [PRED_DIR]

With PRED_DIR, also Google's ``write_predictions`` on seeded random logits (saved in OUT.json):
PRED_DIR/predictions.json, nbest_predictions.json and null_odds.json.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import google_oracle  # noqa: E402

google_oracle.modeling()  # the tf.contrib stand-in run_squad's imports need
from bert import run_squad, tokenization  # noqa: E402


def main(squad, vocab, lower, v2, train, max_seq, stride, max_query, out, pred_dir=None):
    flags = run_squad.FLAGS
    flags.mark_as_parsed()
    flags.version_2_with_negative = v2 == "1"
    tokenizer = tokenization.FullTokenizer(vocab, do_lower_case=lower == "1")
    examples = run_squad.read_squad_examples(squad, is_training=train == "1")
    feats = []
    run_squad.convert_examples_to_features(examples, tokenizer, int(max_seq), int(stride), int(max_query),
                                           train == "1", lambda f: feats.append(f))
    keys = ("unique_id", "example_index", "doc_span_index", "tokens", "token_to_orig_map",
            "token_is_max_context", "input_ids", "input_mask", "segment_ids", "start_position",
            "end_position",
            "is_impossible")
    logits = {}
    if pred_dir:
        import random
        rng = random.Random(3)
        results = []
        for f in feats:  # spans of the document favoured, as a trained model would
            start = [rng.gauss(0, 1) + (2.0 if f.segment_ids[i] else 0.0) for i in range(int(max_seq))]
            end = [rng.gauss(0, 1) + (2.0 if f.segment_ids[i] else 0.0) for i in range(int(max_seq))]
            logits[f.unique_id] = (start, end)
            results.append(run_squad.RawResult(unique_id=f.unique_id, start_logits=start, end_logits=end))
        Path(pred_dir).mkdir(parents=True, exist_ok=True)
        run_squad.write_predictions(examples, feats, results, 20, 30, lower == "1",
                                    str(Path(pred_dir) / "predictions.json"),
                                    str(Path(pred_dir) / "nbest_predictions.json"),
                                    str(Path(pred_dir) / "null_odds.json"))
    Path(out).write_text(json.dumps({"examples": [e.qas_id for e in examples], "logits": logits,
                                     "features": [{k: getattr(f, k) for k in keys} for f in feats]}))


if __name__ == "__main__":
    main(*sys.argv[1:])
