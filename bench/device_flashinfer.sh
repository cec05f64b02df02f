#!/usr/bin/env bash
# The GPU-machine side of the FlashInfer JIT figures and the PCIe IPC check (bench/README.md):
# compiles a target's FlashInfer JIT list from an unpatched PyPI flashinfer wheel, run from
# the repository root on a lent GPU machine with .whl/ carried:
#   .whl/flashinfer_python-$FI_VERSION.site.tar.xz  the PyPI wheel's files, unpacked (the
#                                                   wheel itself is over the 64 MiB a call carries)
#   .whl/*.whl  apache-tvm-ffi 0.1.11; for the pcie phase also pygit2, cffi, pycparser,
#               platformdirs (builder's imports the machine lacks)
#
#   [FI_VERSION=0.7.2] [FI_SHA256=...] [JIT_TARGET=sm120] [JIT_SET=sm120-current] \
#   [JIT_ARCH=12.0f] [JIT_ONLY="fused_moe ..."] bash bench/device_flashinfer.sh SECONDS PHASES
#   # PHASES: jit,pcie
#
# FI_VERSION names the wheel (flashinfer_python-$FI_VERSION-py3-none-any.whl); FI_SHA256 is
# its sha256, which the pcie phase hands on (known here for 0.7.2 only). The jit phase
# compiles JIT_TARGET's list as bench/jit_full.py reads it from images/$JIT_TARGET/target.toml,
# or the named list JIT_SET of jit_full.py; sm120's runs compiled the set sm120-current (its
# list plus the dense NVFP4 GEMM), so that is JIT_SET's default for sm120 alone (JIT_SET=
# compiles sm120's own list). JIT_ARCH is FLASHINFER_CUDA_ARCH_LIST: 12.0f, what FlashInfer
# computes on an SM120 GPU with nvcc >= 12.9. JIT_ONLY keeps the list's entries that contain
# one of its words. The defaults are the sm120 runs' (flashinfer 0.7.2, sm120-current).
#
# What a call finished is kept in $DEVWORK and skipped by a later call on the same machine,
# which also resumes a module stopped at the deadline. Not inside the repository: there, even
# an ignored folder (.devwork/) was gone at the next call on the warm machine; /tmp survived
# between back-to-back calls (bench/README.md).
set -u -o pipefail
budget=${1:-560}
phases=${2:-jit,pcie}
start=$(date +%s)
FI_VERSION=${FI_VERSION:-0.7.2}
FI_WHEEL=flashinfer_python-$FI_VERSION-py3-none-any.whl
FI_SITE_TAR=.whl/flashinfer_python-$FI_VERSION.site.tar.xz
if [ "$FI_VERSION" = 0.7.2 ]; then
    FI_SHA256=${FI_SHA256:-770550a0aa92b2f10e6c9a1f048dd43713f0f3bb6a12710186fcf8e4e9c99bd8}
fi
JIT_TARGET=${JIT_TARGET:-sm120}
if [ "$JIT_TARGET" = sm120 ]; then default_set=sm120-current; else default_set=; fi
JIT_SET=${JIT_SET-$default_set}
jit_list=(--target "$JIT_TARGET")
[ -n "$JIT_SET" ] && jit_list+=(--set "$JIT_SET")
W=${DEVWORK:-/tmp/builder-devwork-$FI_VERSION}
only=()
for word in ${JIT_ONLY:-}; do only+=(--only "$word"); done
mkdir -p "$W" "$OUT"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

if [ ! -f "$W/site/.ok" ]; then
    rm -rf "$W/site" && mkdir -p "$W/site"
    tar xJf "$FI_SITE_TAR" -C "$W/site" ||
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
            "$FI_SITE_TAR" "$W/site" || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$W/site" .whl/*.whl || exit 1
    touch "$W/site/.ok"
fi
export PYTHONPATH=$W/site:$PWD
command -v ninja > /dev/null || export PATH=$PATH:$(python3 -c 'import ninja; print(ninja.BIN_DIR)')

# The machine, and flashinfer's files checked against the wheel's RECORD (unpatched).
python3 - "$W/site" > "$OUT/setup.json" <<'EOF'
import base64, csv, hashlib, json, os, re, subprocess, sys
from pathlib import Path
site = Path(sys.argv[1])
record = next(site.glob("flashinfer_python-*.dist-info")) / "RECORD"
checked = bad = 0
for path, digest, _ in csv.reader(record.read_text().splitlines()):
    if not digest or path.startswith("../"):  # pip's own entries (the console script)
        continue
    algo, _, want = digest.partition("=")
    got = base64.urlsafe_b64encode(hashlib.new(algo, (site / path).read_bytes()).digest())
    checked += 1
    bad += got.rstrip(b"=").decode() != want
import torch, flashinfer, tvm_ffi
nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
print(json.dumps({
    "flashinfer": flashinfer.__version__, "flashinfer_files_checked": checked,
    "flashinfer_files_differing_from_wheel_record": bad, "tvm_ffi": tvm_ffi.__version__,
    "torch": torch.__version__, "torch_cuda": torch.version.cuda,
    "nvcc": re.search(r"V(\d+\.\d+\.\d+)", nvcc).group(1), "cores": len(os.sched_getaffinity(0)),
    "gpus": subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.splitlines(),
    "pip": subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True).stdout.split(" from ")[0],
}, indent=2))
EOF
cat "$OUT/setup.json"

for phase in ${phases//,/ }; do
    left=$((budget - ($(date +%s) - start)))
    case $phase in
    jit)
        python3 bench/jit_full.py compile "${jit_list[@]}" --arch "${JIT_ARCH:-12.0f}" \
            ${only[@]+"${only[@]}"} \
            --workspace "$W/jit" --out "$OUT" --deadline "$left" 2>&1 | tee -a "$OUT/jit.log"
        ;;
    pcie)
        if [ "$left" -lt 150 ]; then
            echo "device_flashinfer: pcie: only $left s left in this call, not started"
        elif [ -z "${FI_SHA256:-}" ]; then
            echo "device_flashinfer: pcie: FI_SHA256 (the sha256 of $FI_WHEEL) is not set" >&2
            exit 1
        elif [ ! -f "$W/pcie/done" ]; then
            python3 bench/pcie_ipc_check.py --work "$W/pcie" --out "$OUT" --arch 9.0a --tune \
                --timeout "$((left > 300 ? 240 : left - 90))" \
                --flashinfer-wheel "$FI_WHEEL" --flashinfer-wheel-sha256 "$FI_SHA256" \
                2>&1 | tee -a "$OUT/pcie.log" && touch "$W/pcie/done"
        fi
        ;;
    esac
done
echo "device_flashinfer: $(($(date +%s) - start)) s"
