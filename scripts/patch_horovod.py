"""Apply the four changes that make Horovod 0.28.1 build and run against torch 2.13,
TensorFlow 2.21 and tf-keras 2.21 (see docs/development.md, "Why Horovod is patched").

Usage: python scripts/patch_horovod.py path/to/horovod-0.28.1

Every edit must match exactly once; a source tree that differs from the 0.28.1 sdist is
refused with the file and the text that was not found, instead of building something else.
Applying it twice is refused as well (the marker line tells that it was already patched).
"""

from __future__ import annotations

import sys
from pathlib import Path

MARKER = "# hvd_bert: patched"

# (file, old, new, why)
EDITS = [
    (
        "horovod/torch/CMakeLists.txt",
        'if(NOT Pytorch_VERSION VERSION_LESS "1.5.0")\n    set(CMAKE_CXX_STANDARD 14)\nendif()',
        'if(NOT Pytorch_VERSION VERSION_LESS "1.5.0")\n    set(CMAKE_CXX_STANDARD 17)  '
        + MARKER + ": torch >= 2.1 needs C++17\nendif()",
        "torch >= 2.1 and absl refuse C++14",
    ),
    (
        "horovod/torch/CMakeLists.txt",
        "    if (Pytorch_CXX11)\n        list(APPEND PYTORCH_LINKER_LIBS gloo)",
        "    if (Pytorch_CXX11)\n        list(APPEND PYTORCH_LINKER_LIBS compatible17_gloo)  "
        + MARKER + ": C++17 gloo for a C++17 target",
        "C++14 gloo linked into a C++17 target: multiple definition of kDefaultTimeout",
    ),
    (
        "horovod/tensorflow/CMakeLists.txt",
        'list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")',
        MARKER + ": xla_mpi_ops.cc needs XLA headers that TF 2.21 wheels lack\n"
        + '# list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")',
        "TF 2.21 wheels have no highwayhash/XLA private headers",
    ),
    (
        "horovod/tensorflow/keras/__init__.py",
        "    from keras import backend as K",
        "    from tensorflow.keras import backend as K  " + MARKER + ": tf-keras, not Keras 3",
        "Keras 3's backend lacks get_value/set_value/constant",
    ),
    (
        "horovod/tensorflow/keras/callbacks.py",
        "    from keras import backend as K",
        "    from tensorflow.keras import backend as K  " + MARKER + ": tf-keras, not Keras 3",
        "Keras 3's backend lacks get_value/set_value/constant",
    ),
]


def patch(tree: Path) -> None:
    if not (tree / "setup.py").is_file() or not (tree / "horovod").is_dir():
        raise SystemExit(f"patch_horovod: {tree} is not an unpacked Horovod sdist "
                         "(no setup.py and horovod/ there); pass the folder that holds them")
    texts: dict[str, str] = {}
    for rel, old, new, why in EDITS:
        path = tree / rel
        if rel not in texts:
            if not path.is_file():
                raise SystemExit(f"patch_horovod: {path} is missing; is this Horovod 0.28.1?")
            texts[rel] = path.read_text()
        text = texts[rel]
        if MARKER in text and new in text:
            raise SystemExit(f"patch_horovod: {path} is already patched; start from a fresh sdist")
        count = text.count(old)
        if count != 1:
            raise SystemExit(
                f"patch_horovod: expected the text below once in {path}, found it {count} times "
                f"(change needed because {why}); is this Horovod 0.28.1?\n{old}")
        texts[rel] = text.replace(old, new)
    for rel, text in texts.items():
        (tree / rel).write_text(text)
    changes = len({why for *_, why in EDITS})  # (one change may take edits in several files)
    print(f"patch_horovod: applied {changes} changes ({len(EDITS)} edits in {len(texts)} files) to {tree}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    patch(Path(sys.argv[1]))
