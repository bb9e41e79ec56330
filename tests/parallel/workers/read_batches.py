"""Print a digest of one epoch of one rank's batches, read by the PyTorch or the TensorFlow
reader, each in its own process (as a job runs one framework)."""

import hashlib
import json
import sys

fw, folder, rank, world, stride, seed, epoch, batch, buffer = sys.argv[1:10]
rank, world, seed, epoch, batch, buffer = map(int, (rank, world, seed, epoch, batch, buffer))
grouping, kind = (int(sys.argv[10]), sys.argv[11]) if len(sys.argv) > 10 else (0, "bert-pretraining")
stride = stride == "1"
rows = []
if grouping and fw == "pt":  # epoch 0 of the training stream, batches padded to their longest
    from hvd_bert.pt.data import ShardedDataset
    ds = ShardedDataset(folder, kind, rank, world, batch, seed=seed, shuffle_buffer=buffer,
                        record_striding=stride, length_grouping=grouping)
    for b in ds.epoch_batches(0):
        rows.append({k: v.numpy().tolist() for k, v in sorted(b.items())})
elif grouping:
    from hvd_bert.tf.data import make_dataset, stream
    _, n = make_dataset(folder, kind, rank, world, batch, seed=seed, shuffle_buffer=buffer,
                        record_striding=stride)
    it = stream(folder, kind, rank, world, batch, seed=seed, shuffle_buffer=buffer, record_striding=stride,
                length_grouping=grouping)
    for _ in range(n):
        rows.append({k: v.numpy().tolist() for k, v in sorted(next(it).items())})
elif fw == "pt":
    from hvd_bert.pt.data import ShardedDataset
    ds = ShardedDataset(folder, kind, rank, world, batch, seed=seed, shuffle_buffer=buffer,
                        record_striding=stride, epoch=epoch)
    for b in ds:
        rows.append({k: v.numpy().tolist() for k, v in sorted(b.items())})
else:
    from hvd_bert.tf.data import make_dataset
    ds, _ = make_dataset(folder, kind, rank, world, batch, seed=seed, shuffle_buffer=buffer,
                         record_striding=stride, epoch=epoch)
    for b in ds:
        rows.append({k: v.numpy().tolist() for k, v in sorted(b.items())})
text = json.dumps(rows)
print(json.dumps({"batches": len(rows), "sha": hashlib.sha256(text.encode()).hexdigest(),
                  "first_ids": rows[0]["input_ids"][0][:6] if rows else None,
                  "widths": [len(r["input_ids"][0]) for r in rows]}))
