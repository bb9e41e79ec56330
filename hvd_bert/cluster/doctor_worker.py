"""One rank of ``hvd-bert doctor``'s allreduce check: every rank contributes rank + 1 and
must get size (size + 1) / 2 back. Prints one line per rank; exits 1 on a wrong sum."""

import os
import sys

import hvd_bert  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)


def main(framework: str) -> int:
    if framework == "torch":
        import torch
        import horovod.torch as hvd

        hvd.init()
        got = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()
    elif framework == "tensorflow":
        import tensorflow as tf
        import horovod.tensorflow as hvd

        hvd.init()
        got = float(hvd.allreduce(tf.constant([hvd.rank() + 1.0]), op=hvd.Sum).numpy()[0])
    else:
        raise SystemExit(f"unknown framework {framework!r}")
    n = hvd.size()
    want = n * (n + 1) / 2
    controller = "mpi" if hvd.mpi_enabled() else ("gloo" if hvd.gloo_enabled() else "?")
    line = f"doctor-rank {hvd.rank()}/{n} controller={controller} allreduce={got} expected={want}"
    print(line, flush=True)
    out = os.environ.get("HVD_BERT_DOCTOR_OUT")
    if out:  # also to a file: a launcher may drop the output of a process that exits at once
        with open(os.path.join(out, f"rank{hvd.rank()}.txt"), "w") as f:
            f.write(line + "\n")
    return 0 if got == want else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
