#!/usr/bin/env bash
# Horovod 0.28.1 for PyTorch alone, with NCCL for GPU tensors and Gloo as the controller, built
# against the PyTorch and CUDA that a GPU machine already has: for a machine whose image has a
# CUDA build of PyTorch but neither Horovod nor TensorFlow, and maybe no network (the sdist is
# a file you bring). benchmarks/gpu_check.sh --horovod-sdist calls it. The project's own
# set-up (scripts/setup.sh with HVD_BERT_GPU=1, docker/Dockerfile.gpu) builds Horovod for both
# frameworks instead; this is the smaller build for a machine that only measures.
#
#   bash benchmarks/gpu_horovod.sh horovod-0.28.1.tar.gz TARGET   # then PYTHONPATH=TARGET
#
# Settings (environment): PYTHON (default python3), HOROVOD_BUILD_CUDA_CC_LIST (default: the
# compute capability of GPU 0, e.g. 90 on an H100/H200).
set -euo pipefail
[[ $# == 2 ]] || { echo "usage: gpu_horovod.sh HOROVOD_SDIST TARGET_DIR" >&2; exit 2; }
sdist=$(readlink -f "$1")
target=$(readlink -m "$2")
[[ -f $sdist ]] || { echo "gpu_horovod: no sdist at $1: pass horovod-0.28.1.tar.gz (pip download --no-binary :all: horovod==0.28.1)" >&2; exit 2; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

tar -xzf "$sdist" -C "$work"
src=$(echo "$work"/horovod-*)
"$PY" "$ROOT/scripts/patch_horovod.py" "$src"
# Without TensorFlow there is no compatible17_gloo target (the top-level CMakeLists makes it for
# a C++17 TensorFlow): the C++17 torch target links gloo itself, built as C++17 too.
sed -i 's/list(APPEND PYTORCH_LINKER_LIBS compatible17_gloo)/list(APPEND PYTORCH_LINKER_LIBS gloo)/' \
    "$src/horovod/torch/CMakeLists.txt"
sed -i 's/-std=c++11/-std=c++17/' "$src/third_party/gloo/CMakeLists.txt"
sed -i '1i set(CMAKE_CXX_STANDARD 17)' "$src/third_party/gloo/CMakeLists.txt"
# cffi is in Horovod's setup_requires only for PyTorch builds of long ago; without it installed,
# setup.py would try to download it
"$PY" -c "import cffi" 2>/dev/null || sed -i "s/    require_list.append('cffi>=1.4.0')/    pass/" "$src/setup.py"
# nvcc 13 has no C++11 dialect for the CUDA kernels
sed -i 's/set(CMAKE_CUDA_STANDARD 11)/set(CMAKE_CUDA_STANDARD 17)/' "$src/horovod/common/ops/cuda/CMakeLists.txt"

# NCCL: the one PyTorch loads (the nvidia-nccl wheel), else the system's
site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
header=$(find "$site/nvidia" /usr/include /usr/local/cuda/include -name nccl.h 2>/dev/null | head -n 1 || true)
lib=$(find "$site/nvidia" /usr/lib /usr/local/cuda/lib64 -name 'libnccl.so*' 2>/dev/null | head -n 1 || true)
[[ -n $header && -n $lib ]] || { echo "gpu_horovod: NCCL not found (nccl.h: '${header}', libnccl.so: '${lib}')" >&2; exit 2; }
mkdir -p "$work/nccl"
ln -s "$lib" "$work/nccl/libnccl.so"
cc=${HOROVOD_BUILD_CUDA_CC_LIST:-$("$PY" -c "import torch; print('%d%d' % torch.cuda.get_device_capability(0))")}
echo "gpu_horovod: torch $("$PY" -c 'import torch; print(torch.__version__)'), NCCL $lib, sm_$cc"

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO HOROVOD_GPU_OPERATIONS=NCCL \
    HOROVOD_NCCL_INCLUDE=$(dirname "$header") HOROVOD_NCCL_LIB=$work/nccl HOROVOD_NCCL_LINK=SHARED \
    HOROVOD_BUILD_CUDA_CC_LIST=$cc MAKEFLAGS=-j$(nproc) \
    CMAKE_POLICY_VERSION_MINIMUM=3.5 \
    CXXFLAGS="${CXXFLAGS:-} -include cstdint -include string -include stdexcept -include limits -include cstring -include functional -include memory -include algorithm"
# (CMake 4 refuses gloo's cmake_minimum_required(2.8.12); gcc 13's headers no longer bring in
# the standard headers that Horovod 0.28.1's headers use without including them)
(cd "$src" && "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$work/wheel" .)
"$PY" -m pip install -q --no-deps --no-index --target "$target" "$work"/wheel/horovod-*.whl
echo "gpu_horovod: installed in $target (NCCL library folder for LD_LIBRARY_PATH: $(dirname "$lib"))"
