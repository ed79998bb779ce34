#!/bin/bash
# gangctl's sides of controller_peer.py and pytorchjob_peer.py, and sim_speed.py at 20,000 jobs, for two
# commits, interleaved: 3 rounds, alternating which commit goes first. Each commit is a git worktree
# with the venv linked in:
#   git worktree add ../wt-before <commit>; git worktree add ../wt-after <commit>
#   ln -s $PWD/.venv ../wt-before/.venv; ln -s $PWD/.venv ../wt-after/.venv
#   BEFORE=../wt-before AFTER=../wt-after OUT=/tmp/before-after benchmarks/before_after.sh
# Issue 35's figures (benchmarks/results/comparisons/issue35-refactor.json) were measured this way.
set -u
BEFORE=$(realpath "$BEFORE"); AFTER=$(realpath "$AFTER"); mkdir -p "$OUT"; OUT=$(realpath "$OUT")
PY="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python"   # not realpath: the venv's python is a symlink to the base interpreter
for round in 1 2 3; do
  if [ $((round % 2)) = 1 ]; then order="before after"; else order="after before"; fi
  for side in $order; do
    if [ "$side" = before ]; then tree=$BEFORE; else tree=$AFTER; fi
    cd "$tree"
    echo "$(date +%T) round $round $side" >> "$OUT/progress.log"
    PYTHONPATH=$tree "$PY" benchmarks/sim_speed.py --sizes 20000 --json > "$OUT/sim-$side-$round.json"
    PYTHONPATH=$tree "$PY" benchmarks/controller_peer.py --only gangctl --rounds 1 --cluster-prefix gangctl-bench-ba \
      --json "$OUT/cp-$side-$round.json" > "$OUT/cp-$side-$round.log" 2>&1
    PYTHONPATH=$tree "$PY" benchmarks/pytorchjob_peer.py --only gangctl --rounds 1 --cluster-prefix gangctl-bench-ba \
      --json "$OUT/pj-$side-$round.json" > "$OUT/pj-$side-$round.log" 2>&1
  done
done
echo "$(date +%T) done" >> "$OUT/progress.log"
