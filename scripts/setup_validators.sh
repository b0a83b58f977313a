#!/usr/bin/env bash
# Build the pinned virtual environments that scripts/validate_emitters.py runs the frameworks' OWN config code in
# (shared/reference/emitters.md sections 1.6, 2.4, 3.4, 4.3). Each lives under .venv-validators/ (git-ignored):
#
#   validator    venv                               pins                                              python
#   deepspeed    .venv-validators/deepspeed         torch==2.13.0 (CPU) deepspeed==0.19.8              3.11
#   torchrun     (the deepspeed venv: torch.distributed.run of torch 2.13.0)                           3.11
#   torchtitan   .venv-validators/torchtitan        torch==2.13.0 (CPU) torchtitan==0.3.0 triton        3.11
#                .venv-validators/torchtitan-0.2    torch==2.13.0 (CPU) torchtitan==0.2.2 triton        3.11
#   megatron     .venv-validators/megatron          torch==2.14.1 megatron-core==0.19.2 (recipe A)      3.12
#                (also validates Megatron-Bridge's model.* overrides through mcore's TransformerConfig)
#
# Measured here (2 shared cores, PyPI mirror, the torch 2.13.0 CPU wheel on local disk; fresh venv each):
#   deepspeed        36 s   1.0 GB   (torch 19 s from the local wheel; deepspeed sdist -> pure-Python wheel 11 s)
#   torchtitan       66 s   2.5 GB   (torch 21 s; torchtitan 0.3.0 + triton 38 s)
#   torchtitan-0.2   57 s   2.4 GB   (torch 21 s; torchtitan 0.2.2 + triton 28 s)
#   megatron         93 s   5.5 GB   (torch 2.14.1 76 s: PyPI's only Linux build is the CUDA one, nvidia-* libs +
#                                     triton, and it runs on CPU; megatron-core 0.19.2 7 s, its wheel ships
#                                     megatron/training)
# Those figures are with pip's byte-compilation; installs now pass --no-compile and the import check compiles what
# the harness imports: deepspeed 91 -> 52 s, torchtitan 159 -> 115 s, old and new one after the other on a slow hour.
# All four: 4.2 min and 11.4 GB. Re-running is cheap: a venv whose import check passes is kept ("ready (kept)";
# 19 s for all four, the import checks).
#
#   scripts/setup_validators.sh                       # all of them
#   scripts/setup_validators.sh --only deepspeed --only torchtitan
#   scripts/setup_validators.sh --only megatron --force   # rebuild from scratch
#
# Prints one line per validator: "ready" or "failed: <why>", and the time taken. Exit 0 when every requested
# validator is ready, 1 when one failed (the others are still built), 2 on bad arguments.
# Interpreters: $PYTHON311 / $PYTHON312, else python3.11 / python3.12 on PATH, else pyenv's versions.

set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE="${VALIDATOR_VENVS:-$ROOT/.venv-validators}"
ALL=(deepspeed torchrun torchtitan megatron)
ONLY=()
FORCE=0
WITH_TT02=1

usage() { sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
        --only)
            [ $# -ge 2 ] || { echo "error: --only: needs a validator name (${ALL[*]})" >&2; exit 2; }
            ONLY+=("$2"); shift 2 ;;
        --only=*) ONLY+=("${1#--only=}"); shift ;;
        --force) FORCE=1; shift ;;
        --no-torchtitan-0.2) WITH_TT02=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "error: $1: unknown argument; usage: scripts/setup_validators.sh [--only NAME ...] [--force]" >&2
           exit 2 ;;
    esac
done
[ ${#ONLY[@]} -gt 0 ] || ONLY=("${ALL[@]}")
for v in "${ONLY[@]}"; do
    case " ${ALL[*]} " in
        *" $v "*) ;;
        *) echo "error: --only: unknown validator '$v'; choose from ${ALL[*]}" >&2; exit 2 ;;
    esac
done

find_python() {  # find_python 3.11 -> path of an interpreter of that version, or nothing
    local ver="$1" var="PYTHON${1/./}" cand
    for cand in "${!var:-}" "$(command -v "python$ver" 2>/dev/null)" "$HOME"/.pyenv/versions/"$ver".*/bin/python"$ver" \
        /root/.pyenv/versions/"$ver".*/bin/python"$ver" /usr/bin/python"$ver" /usr/local/bin/python"$ver"; do
        [ -n "$cand" ] && [ -x "$cand" ] || continue
        if "$cand" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$ver'.split('.'))))" 2>/dev/null
        then echo "$cand"; return 0; fi
    done
    return 1
}

# The import check of each venv: exits 0 when the venv can run its harness (scripts/validators/*.py).
CHECK_DEEPSPEED='
import importlib.metadata as md, torch, deepspeed.runtime.config, torch.distributed.run
assert torch.__version__.split("+")[0] == "2.13.0", torch.__version__
assert md.version("deepspeed") == "0.19.8", md.version("deepspeed")'
CHECK_TORCHTITAN='
import importlib.metadata as md, torch, triton, torchtitan.config.manager
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.distributed import pipeline_parallel
assert md.version("torchtitan") == "VERSION", md.version("torchtitan")'
CHECK_MEGATRON='
import importlib.metadata as md, torch, megatron.training.arguments, megatron.core.parallel_state
from megatron.core.transformer import TransformerConfig
assert md.version("megatron-core") == "0.19.2", md.version("megatron-core")
assert torch.__version__.split("+")[0] == "2.14.1", torch.__version__'

declare -A RESULT TIME
FAILED=0

du_of() { du -sh "$1" 2>/dev/null | cut -f1; }

# build NAME DIR PYVER CHECK PIP-STEP...   (each PIP-STEP is one quoted "pkg pkg" list for one pip install)
build() {
    local name="$1" dir="$2" pyver="$3" check="$4"; shift 4
    local start=$SECONDS py log
    log="$BASE/$name.log"
    mkdir -p "$BASE"
    if [ "$FORCE" = 0 ] && [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "$check" >/dev/null 2>&1; then
        RESULT[$name]="ready (kept, $(du_of "$dir"))"; TIME[$name]=$((SECONDS - start)); return 0
    fi
    if ! py="$(find_python "$pyver")"; then
        RESULT[$name]="failed: no Python $pyver interpreter (set PYTHON${pyver/./} or install it, e.g. pyenv install $pyver)"
        TIME[$name]=$((SECONDS - start)); FAILED=1; return 1
    fi
    rm -rf "$dir"
    echo "[$name] building $dir with $py (log: $log)" >&2
    {
        "$py" -m venv "$dir"
    } >"$log" 2>&1 || {
        RESULT[$name]="failed: python$pyver -m venv $dir did not work (see $log)"; TIME[$name]=$((SECONDS - start))
        FAILED=1; return 1
    }
    local step t0
    for step in "$@"; do
        t0=$SECONDS
        echo "[$name] pip install $step" >&2
        # shellcheck disable=SC2086  # a step is a space-separated package list on purpose
        # --no-compile: pip would byte-compile every module of torch and triton (26 of torch's 45 s here); the import
        # check below compiles, and caches, the modules the harnesses import
        if ! "$dir/bin/python" -m pip install --no-compile $step >>"$log" 2>&1; then
            local why
            why="$(grep -E '^(ERROR|error):' "$log" | tail -n 2 | tr '\n' ' ' | cut -c1-300)"
            grep -qi 'No space left' "$log" && why="no space left on device ($why)"
            RESULT[$name]="failed: pip install $step: ${why:-see $log}"; TIME[$name]=$((SECONDS - start))
            FAILED=1; return 1
        fi
        echo "[$name]   done in $((SECONDS - t0)) s" >&2
    done
    local out
    if ! out="$(env -u PYTHONDONTWRITEBYTECODE "$dir/bin/python" -c "$check" 2>&1)"; then
        RESULT[$name]="failed: installed, but the import check fails: $(echo "$out" | tail -n 1 | cut -c1-300)"
        TIME[$name]=$((SECONDS - start)); FAILED=1; return 1
    fi
    RESULT[$name]="ready ($(du_of "$dir"))"; TIME[$name]=$((SECONDS - start))
}

want() { case " ${ONLY[*]} " in *" $1 "*) return 0 ;; esac; return 1; }

ORDER=()
if want deepspeed || want torchrun; then
    build deepspeed "$BASE/deepspeed" 3.11 "$CHECK_DEEPSPEED" "torch==2.13.0" "deepspeed==0.19.8"
    ORDER+=(deepspeed)
    if want torchrun; then
        RESULT[torchrun]="${RESULT[deepspeed]/#ready*/ready (uses the deepspeed venv: torch 2.13.0)}"
        TIME[torchrun]=0; ORDER+=(torchrun)
    fi
fi
if want torchtitan; then
    build torchtitan "$BASE/torchtitan" 3.11 "${CHECK_TORCHTITAN/VERSION/0.3.0}" \
        "torch==2.13.0" "torchtitan==0.3.0 triton"
    ORDER+=(torchtitan)
    if [ "$WITH_TT02" = 1 ]; then
        build torchtitan-0.2 "$BASE/torchtitan-0.2" 3.11 "${CHECK_TORCHTITAN/VERSION/0.2.2}" \
            "torch==2.13.0" "torchtitan==0.2.2 triton"
        ORDER+=(torchtitan-0.2)
    fi
fi
if want megatron; then
    build megatron "$BASE/megatron" 3.12 "$CHECK_MEGATRON" "torch==2.14.1" "megatron-core==0.19.2"
    ORDER+=(megatron)
fi

echo
printf '%-16s %6s  %s\n' validator seconds result
for name in "${ORDER[@]}"; do
    printf '%-16s %6s  %s\n' "$name" "${TIME[$name]}" "${RESULT[$name]}"
done
exit "$FAILED"
