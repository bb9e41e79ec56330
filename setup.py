"""hvd_bert: distributed large-batch training on Horovod, for TensorFlow (Keras) and PyTorch.

The frameworks and Horovod are pinned and installed by scripts/setup.sh (Horovod 0.28.1
needs a patched build for torch 2.13 and TensorFlow 2.21); `pip install -e .` installs
the package itself.
"""

from setuptools import find_packages, setup

setup(
    name="hvd_bert",
    version="0.1.0",
    description="Distributed large-batch training on Horovod: LAMB, NVLAMB, LARS, "
                "mixed precision, gradient accumulation; BERT and NCF in TensorFlow and PyTorch",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["hvd_bert", "hvd_bert.*"]),
    package_data={"hvd_bert": ["recipes/*.yaml"]},
    install_requires=["numpy>=1.26", "pyyaml>=6.0", "crc32c>=2.3"],
    extras_require={
        "pt": ["torch==2.13.0", "tqdm>=4.66"],
        "tf": ["tensorflow-cpu==2.21.0", "tf-keras==2.21.0", "tqdm>=4.66"],
        "mpi": ["mpi4py>=4.0"],
    },
    entry_points={"console_scripts": ["hvd-bert=hvd_bert.cli:main"]},
    license="Apache-2.0",
)
