#!/usr/bin/env bash
# The scale benchmarks, one device call each (10 minutes at most; 15 minutes of device time a
# session), run through hack/device/run.sh; each writes its table to OUTDIR too. Until the local
# controller-manager's client was raised (components.sh), its garbage collector deleted a
# finished job's pods at 20/s: fleet did not end within a call and a 1,024-worker repetition
# took minutes. On 2 cores fleet (multiworker alone) now takes 9 minutes end to end.
#   hack/device/bench.sh scale OUTDIR   bench_scale.py at 8, 64, 256 and 1,024 workers, 3 reps
#   hack/device/bench.sh side OUTDIR    bench_side_by_side.py start, fail and delete, multiworker
#                                       and TFJob alternating (a kit built with --tfjob)
#   hack/device/bench.sh fleet OUTDIR   1,000 x 8, multiworker alone, shortened steady windows
#   hack/device/bench.sh fleet-side OUTDIR   the same with TFJob too (a kit built with --tfjob),
#                                       alternating: how long TFJob takes at 1,000 x 8 is
#                                       unmeasured, so it may not fit one call; run fleet first
# e.g. the device tool's command: hack/device/bench.sh scale $OUT   (carry: .kit)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
usage="usage: bench.sh scale|side|fleet|fleet-side OUTDIR"
what=${1:?$usage} out=${2:?$usage}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
contenders=multiworker
if tar -tJf "$repo/.kit/bin.tar.xz" | grep -qx training-operator; then
  contenders=multiworker,tfjob
fi
case $what in
  scale) cmd=(tests/bench/bench_scale.py --workers 8,64,256,1024 --reps 3) ;;
  side) cmd=(tests/bench/bench_side_by_side.py --scenarios start,fail,delete --reps 3
             --contenders "$contenders") ;;
  fleet | fleet-side)
    [ "$what" = fleet ] && contenders=multiworker
    cmd=(tests/bench/bench_side_by_side.py --scenarios scale --contenders "$contenders"
         --settle 10 --window 30 --baseline 10) ;;
  *) echo "unknown benchmark $what (scale, side, fleet or fleet-side)" >&2; exit 2 ;;
esac
"$repo/hack/device/run.sh" bash -c '.venv/bin/python "$@" 2>&1 | tee "$0"' "$out/$what.txt" "${cmd[@]}"
