"""Running the BERT jobs (`hvd-bert pretrain` / `finetune`) under real `horovodrun` in tests."""

import json

from hvd_bert.cluster import launch

TINY = ["--set", "progress=false", "--set", "max_seq_length=64", "--set", "max_predictions_per_seq=10",
        "--set", "train.log_every=5", "--set", "train.optim.lr=1e-2", "--set", "shuffle_buffer=64",
        "--set", "train.batch.local_batch_size=8"]


def metrics_of(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def pretrain(framework, data, out, *extra, np=2, timeout=600):
    res = launch.run(["-m", "hvd_bert", "pretrain", "--framework", framework, "--set", f"data={data}",
                      "--set", f"train.output_dir={out}", *TINY, *extra], np=np, timeout=timeout)
    assert res.ok, res.explain()
    return metrics_of(out), res.stdout
