"""One rank of the engine contract (tests/parallel/test_engine_contract.py), either framework:
the engine's ``train_micro_batch`` and the shared ``train.engine.fit`` loop.

    python engine_contract.py FRAMEWORK MODE OPTIM K STEPS [overrides...] OUT_DIR
    python engine_contract.py FRAMEWORK batch SCENARIOS.json OUT_DIR

MODE: train (2 ranks x k),
inf (rank 1's loss is inf at step 2), diverge (every step after the first skips, through fit),
resume (fit() with checkpoints in HVD_BERT_TEST_CKPT,
dropout on; rank 0 gets SIGTERM after the step HVD_BERT_TEST_KILL_AT, if set), rollback (what
Horovod elastic does after a lost rank: back to a snapshot taken after step 2, then sync).

``batch`` runs several scenarios one after the other in one launch (one Horovod init, a fresh
model and engine each), so that a test module pays the 2-rank start-up once: SCENARIOS.json is
``{name: {"mode", "optim", "k", "steps", "extra": [...], "ckpt", "kill_at"}}``, and an error a
scenario raises on purpose (a refused resume, a diverged run) is recorded as its result
(``{"error": "Type: message"}``) instead of ending the launch. Scenarios that set ``horovod.*``
settings need a launch of their own (Horovod reads them at init).
"""

import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))
import toy_data as D  # noqa: E402
from toy_models import adapter  # noqa: E402

from hvd_bert.train.backend import get_backend  # noqa: E402
from hvd_bert.config import TrainConfig, apply_overrides  # noqa: E402
from hvd_bert.train.loop import fit  # noqa: E402

LOCAL_B = 4


def scenario(toy, backend, r, n, mode, optim, k, steps, extra=(), ckpt=None, kill_at=0):
    cfg = apply_overrides(TrainConfig(), D.overrides(optim, LOCAL_B, k, steps, *extra))
    backend.set_precision(cfg.precision.mode)
    x, y = D.dataset()
    result = {}

    def batches_from(micro):
        while True:
            rows = D.rank_rows(r, n, LOCAL_B, k, micro)
            yield toy.batch(x[rows], y[rows])
            micro += 1

    if mode == "diverge":  # rank 1's targets are inf from the second step on: every step skips
        model = toy.make_model()
        engine = backend.engine(model, toy.loss, cfg)

        def poisoned(micro):
            for i, (xb, yb) in enumerate(batches_from(micro)):
                yield (xb, yb * float("inf")) if r == 1 and i >= k else (xb, yb)

        fit(engine, poisoned, total_steps=steps, output_dir=ckpt or False, log_every=1,
            progress=False, max_skipped_steps=cfg.max_skipped_steps)
    elif mode == "resume":
        # per-rank seeds: per-rank dropout streams (restored on resume); weights from rank 0
        model = toy.make_model(dropout=0.2, seed=1000 + r)
        engine = backend.engine(model, toy.loss, cfg)

        def on_step(res, metrics):
            if kill_at and r == 0 and res.step == kill_at:
                os.kill(os.getpid(), signal.SIGTERM)

        fr = fit(engine, batches_from, total_steps=steps, output_dir=ckpt or False,
                 checkpoint_every=2, log_every=1, progress=False, on_step=on_step)
        result.update(steps=fr.steps, stopped=fr.stopped_by_signal, params=toy.flat(model),
                      history=fr.history)
    elif mode == "rollback":  # an elastic commit after step 2, steps 3-4, back to the commit, on to the end
        model = toy.make_model()
        engine = backend.engine(model, toy.loss, cfg)
        batches, snap, rolled = batches_from(0), None, False
        while engine.step_count < steps:
            if engine.step_count == 2 and snap is None:
                snap = engine.snapshot(), (engine.step_count, engine.micro_step, engine.skipped_steps)
            if engine.step_count == 4 and not rolled:
                engine.restore_snapshot(snap[0])
                engine.step_count, engine.micro_step, engine.skipped_steps = snap[1]
                engine.sync()
                batches, rolled = batches_from(engine.micro_step), True
            engine.train_micro_batch(next(batches))
        result.update(params=toy.flat(model))
    else:
        model = toy.make_model()
        engine = backend.engine(model, toy.loss, cfg)
        batches = batches_from(0)
        log, local_grad = [], None
        while engine.step_count + engine.skipped_steps < steps:
            xb, yb = next(batches)
            if mode == "inf" and r == 1 and engine.step_count + engine.skipped_steps == 2:
                yb = yb * float("inf")
            before = toy.flat(model)
            res = engine.train_micro_batch((xb, yb))
            if res is None:
                if local_grad is None:  # before the sync step: this rank's own gradient
                    local_grad = toy.local_grad(engine)
                continue
            log.append(dict(step=res.step, lr=res.lr, skipped=res.skipped, scale=res.loss_scale,
                            changed=before != toy.flat(model)))
        result.update(params=toy.flat(model), steps=log, local_grad=local_grad,
                      memory=engine.memory() if hasattr(engine, "memory") else None)
    return result


def threads(framework: str) -> int:
    """The CPU threads the backend gave this rank's framework."""
    if framework == "pt":
        import torch
        return torch.get_num_threads()
    import tensorflow as tf
    return tf.config.threading.get_intra_op_parallelism_threads()


def main():
    framework, mode, *rest = sys.argv[1:]
    toy = adapter(framework)
    backend = get_backend(framework)
    if mode == "batch":
        spec_path, out = rest
        with open(spec_path) as f:
            scenarios = json.load(f)
        r, n = backend.init(apply_overrides(TrainConfig(), []))
        result = {"rank": r, "size": n, "scenarios": {}}
        for name, sc in scenarios.items():
            try:
                got = scenario(toy, backend, r, n, sc["mode"], sc["optim"], int(sc["k"]), int(sc["steps"]),
                               sc.get("extra", ()), sc.get("ckpt"), int(sc.get("kill_at", 0)))
            except Exception as e:  # a refusal the scenario expects; the test checks its text
                got = {"error": f"{type(e).__name__}: {e}"}
            result["scenarios"][name] = got
    else:
        optim, k, steps, *extra, out = rest
        cfg = apply_overrides(TrainConfig(), D.overrides(optim, LOCAL_B, int(k), int(steps), *extra))
        r, n = backend.init(cfg)
        from hvd_bert.cluster.horovod import HOROVOD_KNOBS
        result = {"rank": r, "size": n, "env": {v: os.environ[v] for v in HOROVOD_KNOBS if v in os.environ},
                  "threads": threads(framework)}
        result.update(scenario(toy, backend, r, n, mode, optim, int(k), int(steps), extra,
                               os.environ.get("HVD_BERT_TEST_CKPT"),
                               int(os.environ.get("HVD_BERT_TEST_KILL_AT", "0"))))
    with open(os.path.join(out, f"rank{result['rank']}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
