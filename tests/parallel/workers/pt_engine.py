"""One rank of the PyTorch engine tests (see tests/parallel/test_pt_engine.py).

    python pt_engine.py MODE OPTIM K STEPS [extra overrides...] OUT_DIR

MODE: train (equivalence), inf (rank 1's loss is inf at step 2), resume (fit() with
checkpoints in HVD_BERT_TEST_CKPT; rank 0 gets SIGTERM after the step given by
HVD_BERT_TEST_KILL_AT, if set).
"""

import json
import os
import signal
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import pt_setup as S  # noqa: E402

import horovod.torch as hvd  # noqa: E402

from hvd_bert.pt.engine import Engine, fit  # noqa: E402

LOCAL_B = 4


def main():
    mode, optim, k, steps, *extra, out = sys.argv[1:]
    k, steps = int(k), int(steps)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    result = {"rank": r, "size": n}
    if mode == "resume":
        cfg = S.config(optim, LOCAL_B, k, steps, *extra)
        model = S.make_model(dropout=0.2)
        torch.manual_seed(1000 + r)  # per-rank dropout streams, restored on resume
        engine = Engine.from_config(model, cfg)
        kill_at = int(os.environ.get("HVD_BERT_TEST_KILL_AT", "0"))

        def on_step(res, loss):
            if kill_at and r == 0 and res.step == kill_at:
                os.kill(os.getpid(), signal.SIGTERM)

        fr = fit(engine, lambda m: S.micro_batches(r, n, LOCAL_B, k, m), S.mse, total_steps=steps,
                 output_dir=os.environ["HVD_BERT_TEST_CKPT"], checkpoint_every=2, log_every=1,
                 progress=False, on_step=on_step)
        result.update(steps=fr.steps, stopped=fr.stopped_early, params=S.flat_params(model),
                      history=fr.history)
    else:
        cfg = S.config(optim, LOCAL_B, k, steps, *extra)
        model = S.make_model()
        engine = Engine.from_config(model, cfg)
        batches = S.micro_batches(r, n, LOCAL_B, k)
        steps_log, local_grad = [], None
        while engine.step_count + engine.skipped_steps < steps:
            before = S.flat_params(model)
            with engine.autocast():
                loss = S.mse(model, next(batches))
            if mode == "inf" and r == 1 and engine.step_count + engine.skipped_steps == 2:
                loss = loss * float("inf")
            if not engine.backward(loss):
                if local_grad is None:  # before the sync step: this rank's own gradient
                    local_grad = model.dense_in.weight.grad.reshape(-1)[:8].tolist()
                continue
            res = engine.step()
            steps_log.append(dict(step=res.step, lr=res.lr, skipped=res.skipped,
                                  scale=res.loss_scale, changed=before != S.flat_params(model)))
        result.update(params=S.flat_params(model), steps=steps_log, local_grad=local_grad)
    with open(os.path.join(out, f"rank{r}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
