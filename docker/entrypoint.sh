#!/usr/bin/env bash
# The image's entry point: `python -m autograder "$@"`, with what it writes going to
# $BERTLAB_OUT (/out): the gradebook and, for `batch`, grades.csv (or grades.shard-K-of-N.csv);
# for `grade`, results/<student>/results.json; for `feedback`, feedback/<student>/feedback.html.
# Options given explicitly win. With no arguments: `batch $BERTLAB_SUBMISSIONS` (/submissions).
# A pattern such as '/submissions/*' (quoted, so the host's shell leaves it) is expanded here.
#
# batch, grade and feedback need /out to be a directory this user may write in (in the
# image, one mounted from the host: anything written elsewhere is gone with the container);
# otherwise exit 2, saying what to do.
set -euo pipefail
out="${BERTLAB_OUT:-/out}"
py="${BERTLAB_PYTHON:-python}"
[ $# -gt 0 ] || set -- batch "${BERTLAB_SUBMISSIONS:-/submissions}"
me="uid $(id -u)"
mount_it="mkdir -p out, then docker run ... -v \"\$PWD/out:$out\""
stop() {
    echo "bertlab: $*" >&2
    exit 2
}
mounted() { # is $1 a mount point? (the 5th field of /proc/self/mountinfo)
    local path
    path=$(cd "$1" 2>/dev/null && pwd -P) || return 1
    awk -v p="$path" '$5 == p { found = 1 } END { exit !found }' /proc/self/mountinfo
}
case "$1" in
    batch | grade | feedback) # the commands that write into $out
        if [ ! -e "$out" ]; then
            mkdir -p "$out" 2>/dev/null || stop "$out does not exist and $me cannot make it."
        fi
        [ -d "$out" ] || stop "$out is not a directory."
        if [ "${BERTLAB_IN_IMAGE:-}" = 1 ] && ! mounted "$out"; then
            stop "nothing is mounted on $out: what grading writes would be lost with the container. $mount_it."
        fi
        if [ ! -w "$out" ] || [ ! -x "$out" ]; then
            owner=$(stat -c %u "$out")
            stop "$out is not writable by $me: it belongs to uid $owner (Docker makes a host folder that does" \
                "not exist, as root). Make out/ yourself before docker run (mkdir -p out), or: sudo chown $(id -u) out."
        fi
        ;;
esac
# under --user there is no passwd entry: HOME is / (matplotlib, fontconfig want a writable one)
if [ -z "${HOME:-}" ] || [ ! -w "$HOME" ]; then
    HOME=$(mktemp -d "${TMPDIR:-/tmp}/bertlab-home.XXXXXX")
    export HOME
fi
has() { # has OPTION ARGS...: was OPTION given (as OPTION V or OPTION=V)?
    local opt=$1
    shift
    for a in "$@"; do [[ $a == "$opt" || $a == "$opt="* ]] && return 0; done
    return 1
}
args=()
for a in "$@"; do
    matches=()
    [[ $a == /*[*?[]* ]] && mapfile -t matches < <(compgen -G "$a")
    if [ ${#matches[@]} -gt 0 ]; then args+=("${matches[@]}"); else args+=("$a"); fi
done
set -- "${args[@]}"
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
    feedback)
        has --out "$@" || has -o "$@" || extra+=(--out "$out/feedback")
        ;;
esac
[ ! -w "$out" ] || cd "$out" # anything else written to the working directory lands in /out too
exec "$py" -m autograder "$@" "${extra[@]}"
