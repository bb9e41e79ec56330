"""One Horovod rank: allreduce, broadcast, and one DistributedOptimizer step with
backward_passes_per_step=2 (optionally fp16 compression), in PyTorch or TensorFlow.

    horovodrun -np 2 -H localhost:2 --gloo python hvd_basics.py torch none,fp16 OUT_DIR
    mpirun -np 2 python hvd_basics.py tf none OUT_DIR

Each rank writes OUT_DIR/rank<r>.json, ``{"rank": r, "none": {...}, "fp16": {...}}`` (one
result per compression named, each from its own fresh model and optimizer, in one launch);
the test compares ranks and the hand values.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import expect as E  # noqa: E402

import hvd_bert  # noqa: E402,F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)


def run_torch(compress: bool) -> dict:
    import torch
    import horovod.torch as hvd

    hvd.init()  # Horovod: (once; a second call in the same process does nothing)
    r, n = hvd.rank(), hvd.size()
    s = hvd.allreduce(torch.tensor([r + 1.0, 2.0 * (r + 1)]), op=hvd.Sum)
    b = hvd.broadcast(torch.tensor([10.0 * r + 7.0]), root_rank=0)

    model = torch.nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(E.W0.T))
    opt = torch.optim.SGD(model.parameters(), lr=E.LR)
    opt = hvd.DistributedOptimizer(  # Horovod:
        opt, named_parameters=model.named_parameters(), backward_passes_per_step=E.K,
        compression=hvd.Compression.fp16 if compress else hvd.Compression.none)
    x, y = (torch.from_numpy(a) for a in E.rank_data(r))
    local_grads = []
    for i in range(E.K):
        sl = slice(i * E.LOCAL_B, (i + 1) * E.LOCAL_B)
        # Gradients are summed over micro-batches: divide the loss by K for the mean.
        loss = torch.nn.functional.mse_loss(model(x[sl]), y[sl]) / E.K
        loss.backward()
        if i < E.K - 1:
            local_grads.append(model.weight.grad.detach().numpy().T.copy())
    opt.step()
    w = model.weight.detach().numpy().T.astype(np.float64)
    gathered = hvd.allgather(torch.from_numpy(w.reshape(1, -1))).numpy()
    return dict(rank=r, size=n, sum=s.tolist(), bcast=b.tolist(), w=w.ravel().tolist(),
                gathered=gathered.tolist(), before_sync_grad=local_grads[0].ravel().tolist())


def run_tf(compress: bool) -> dict:
    import tensorflow as tf
    import horovod.tensorflow.keras as hvd

    hvd.init()  # Horovod: (once; a second call in the same process does nothing)
    r, n = hvd.rank(), hvd.size()
    s = hvd.allreduce(tf.constant([r + 1.0, 2.0 * (r + 1)]), op=hvd.Sum)
    b = hvd.broadcast(tf.constant([10.0 * r + 7.0]), root_rank=0)

    keras = tf.keras
    assert keras.layers.Dense.__module__.startswith("tf_keras"), "tf.keras is not tf-keras"
    model = keras.Sequential([keras.layers.Dense(
        1, use_bias=False, input_shape=(3,), kernel_initializer=keras.initializers.Constant(E.W0))])
    opt = hvd.DistributedOptimizer(  # Horovod:
        keras.optimizers.SGD(learning_rate=E.LR), backward_passes_per_step=E.K,
        average_aggregated_gradients=True,
        compression=hvd.Compression.fp16 if compress else hvd.Compression.none)
    model.compile(optimizer=opt, loss="mse")
    x, y = E.rank_data(r)
    model.fit(x, y, batch_size=E.LOCAL_B, epochs=1, shuffle=False, verbose=0)
    w = model.get_weights()[0].astype(np.float64)
    gathered = hvd.allgather(tf.constant(w.reshape(1, -1))).numpy()
    return dict(rank=r, size=n, sum=s.numpy().tolist(), bcast=b.numpy().tolist(),
                w=w.ravel().tolist(), gathered=gathered.tolist())


if __name__ == "__main__":
    framework, compressions, out_dir = sys.argv[1:4]
    result = {}
    for compression in compressions.split(","):
        compress = compression == "fp16"
        result[compression] = run_torch(compress) if framework == "torch" else run_tf(compress)
        result["rank"] = result[compression]["rank"]
    with open(os.path.join(out_dir, f"rank{result['rank']}.json"), "w") as f:
        json.dump(result, f)
