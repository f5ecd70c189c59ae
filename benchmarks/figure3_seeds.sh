#!/usr/bin/env bash
# The segmented-sequences paper's Figure 3 over training seeds (docs/attention-diagnostics.md, "Over
# training seeds"): for each seed, a RoPE parent of CONFIG, its chunk-extended child (segmented training,
# alpha ALPHA, FACTOR x L_t) and its compute-matched `continue` child, each TOKENS more tokens; then one
# `extrapos attention` over all of them at 1, 2 and 4 x the parent's L_t, the labels repeated once per seed,
# into OUT/figure/median-weight.{md,png} (each row the mean over seeds, paired per seed, t over seeds).
#
#   benchmarks/figure3_seeds.sh                      # SEEDS="0 1 2" CONFIG=cpu/medium OUT=runs/figure3-seeds
#   SEEDS="0 1" CONFIG=cpu/tiny OUT=/tmp/f3 TOKENS=2048 benchmarks/figure3_seeds.sh
#
# A parent is trained as `extrapos compare` trains a row of a sweep with `seeds = [...]`: the preset, then
# `train.seed=<s>` as the last override; so OUT/rope-seed<s> of cpu/medium is the medium-seeds sweep's
# `rope-seed<s>` run, and a copy of that run put there is used as it is (`cp -r SWEEP/runs/rope-seed0 OUT/`).
# The children keep their parent's seed (`extrapos extend` copies train.seed). Resumable: a run with its
# summary.json is skipped, a started one resumed (--resume), the attention results are reused when they
# hold this request of these weights.
#
# Environment: SEEDS, CONFIG, OUT, TOKENS (131072), FACTOR (4), ALPHA (0.25), MAX_TOKENS (16384, the
# held-out tokens attention reads per length, its default); EXTRA, space-separated
# KEY=VALUE overrides of the parents (before the seed; e.g. a test's tiny data); PYTHON, the interpreter
# extrapos is installed in (default python3).
set -euo pipefail
SEEDS=${SEEDS:-"0 1 2"}
CONFIG=${CONFIG:-cpu/medium}
OUT=${OUT:-runs/figure3-seeds}
TOKENS=${TOKENS:-131072}
FACTOR=${FACTOR:-4}
ALPHA=${ALPHA:-0.25}
MAX_TOKENS=${MAX_TOKENS:-16384}
EXTRA=${EXTRA:-}
PY=${PYTHON:-python3}

# progress bars on a terminal only: a log written through nohup gets the commands' lines, not redrawn bars
quiet=()
[ -t 2 ] || quiet=(--no-progress)
extrapos() {
    local command=$1
    shift
    "$PY" -m extrapos "$command" "${quiet[@]}" "$@"
}

read -r -a seeds <<<"$SEEDS"
read -r -a extra <<<"$EXTRA"
if [ "${#seeds[@]}" -lt 1 ]; then
    echo "figure3_seeds.sh: SEEDS names no seed; set e.g. SEEDS=\"0 1 2\"." >&2
    exit 2
fi
sets=()
for kv in "${extra[@]}"; do
    sets+=(--set "$kv")
done
mkdir -p "$OUT"

# an extension run: skipped when finished, resumed when started
extend() {
    local parent=$1 out=$2
    shift 2
    if [ -f "$out/summary.json" ]; then
        echo "== $out: finished, skipped"
    elif [ -f "$out/config.toml" ]; then
        echo "== $out: resuming"
        extrapos extend "$parent" "$@" --factor "$FACTOR" --tokens "$TOKENS" --out "$out" --resume
    else
        echo "== $out: extending $parent"
        extrapos extend "$parent" "$@" --factor "$FACTOR" --tokens "$TOKENS" --out "$out"
    fi
}

runs=()
labels=()
chunk_label="chunk-$ALPHA x$FACTOR"
for seed in "${seeds[@]}"; do
    parent="$OUT/rope-seed$seed"
    # as compare/run.py builds a seed's run: the preset, the overrides, then train.seed=<s> last
    train=(--config "$CONFIG" "${sets[@]}" --set "train.seed=$seed" --out "$parent")
    if [ -f "$parent/summary.json" ]; then
        echo "== $parent: finished, skipped"
    elif [ -f "$parent/config.toml" ]; then
        echo "== $parent: resuming"
        extrapos train "${train[@]}" --resume
    else
        echo "== $parent: training seed $seed"
        extrapos train "${train[@]}"
    fi
    extend "$parent" "$OUT/chunk-seed$seed" --method chunk --alpha "$ALPHA"
    extend "$parent" "$OUT/continue-seed$seed" --method continue
    runs+=("$parent" "$OUT/chunk-seed$seed" "$OUT/continue-seed$seed")
    labels+=("RoPE parent" "$chunk_label" "continue")
done

# "past L_t" is past the parent's training length for every run (the children train at FACTOR x L_t)
base=$("$PY" -c 'import sys
from extrapos.run.config import load_run_config
print(load_run_config(sys.argv[1]).model.train_length)' "$OUT/rope-seed${seeds[0]}")
joined=$(
    IFS=,
    echo "${labels[*]}"
)
echo "== attention of ${#runs[@]} runs past L_t = $base -> $OUT/figure"
extrapos attention "${runs[@]}" --base-length "$base" --lengths 1,2,4 --max-tokens "$MAX_TOKENS" \
    --labels "$joined" --figure "$OUT/figure"
