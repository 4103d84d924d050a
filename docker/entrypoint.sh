#!/usr/bin/env bash
# The image's entry point: `python -m autograder "$@"`, with what it writes going to
# $BERTLAB_OUT (/out): the gradebook and, for `batch`, grades.csv (or grades.shard-K-of-N.csv);
# for `grade`, results/<student>/results.json. Options given explicitly win.
# With no arguments: `batch $BERTLAB_SUBMISSIONS` (/submissions).
set -euo pipefail
out="${BERTLAB_OUT:-/out}"
py="${BERTLAB_PYTHON:-python}"
[ $# -gt 0 ] || set -- batch "${BERTLAB_SUBMISSIONS:-/submissions}"
mkdir -p "$out"
has() {  # has OPTION ARGS...: was --OPTION given (as --OPTION V or --OPTION=V)?
    local opt=$1; shift
    for a in "$@"; do [[ $a == "$opt" || $a == "$opt="* ]] && return 0; done
    return 1
}
extra=()
case "$1" in
    batch)
        shard=""
        prev=""
        for a in "$@"; do
            [[ $prev == --shard ]] && shard=$a
            [[ $a == --shard=* ]] && shard=${a#--shard=}
            prev=$a
        done
        suffix=""
        [ -z "$shard" ] || suffix=".shard-${shard%/*}-of-${shard#*/}"
        has --db "$@" || extra+=(--db "$out/bertlab-gradebook$suffix.sqlite")
        has --csv "$@" || extra+=(--csv "$out/grades$suffix.csv")
        ;;
    grade)
        has --results "$@" || has --results-dir "$@" || extra+=(--results-dir "$out/results")
        ;;
esac
cd "$out"  # anything else written to the working directory lands in /out too
exec "$py" -m autograder "$@" "${extra[@]}"
