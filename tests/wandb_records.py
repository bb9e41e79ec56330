"""The records of an offline Weights & Biases run (``run-<id>.wandb``), read back as wandb's own
protobuf messages (``wandb.proto.wandb_internal_pb2.Record``). The file is wandb's log format: a
7-byte header (``:W&B``, a magic number, a version), then LevelDB-style blocks of 32 KiB whose
records each have a 7-byte header (CRC, length, type: full, first, middle, last); wandb's Python
reader left the package with its Go core, so the tests read the blocks here."""

import struct
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str | Path):
    """Every record of the run's log, in order, as wandb's protobuf ``Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", data[:8]
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # (a block's tail too short for a header is padding)
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        body = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            continue
        if kind in (FULL, FIRST):
            pending = body
        else:
            pending += body
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


def history(path: str | Path) -> list[dict]:
    """The run's logged steps: ``{"_step": n, name: value, ...}`` as ``run.log`` wrote them."""
    import json

    out = []
    for r in records(path):
        if r.WhichOneof("record_type") == "history":
            out.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
    return out


def run(path: str | Path) -> tuple[dict, dict]:
    """``({run_id, project, name, group}, config)`` of the run's first record of its kind."""
    import json

    for r in records(path):
        if r.WhichOneof("record_type") == "run":
            about = {"run_id": r.run.run_id, "project": r.run.project, "name": r.run.display_name,
                     "group": r.run.run_group}
            return about, {i.key: json.loads(i.value_json) for i in r.run.config.update if i.key != "_wandb"}
    raise AssertionError(f"{path} holds no run record")
