#!/usr/bin/env bash
# Whether the Makefile's venv must be made or installed again. Decided by what it was
# installed from (a digest of the files install.sh reads, kept in its stamp), never by file
# dates, which a clone or a copy renews; and a venv made for another checkout (copied here
# with it, or the checkout moved) is made again, since its editable install and its scripts
# would run that checkout's code.
#
# usage (from the project root):
#   scripts/venv.sh prepare PYTHON VENV FILES...  exit 0: up to date; exit 3: the venv is
#                                                 ready for install.sh (made if missing, made
#                                                 again if another checkout's), the reason said
#   scripts/venv.sh stamp VENV FILES...           record what it was installed from
set -euo pipefail
cmd=$1
shift

digest() { cat "$@" | cksum; }

if [ "$cmd" = stamp ]; then
    venv=$1
    shift
    echo "$(digest "$@") $(pwd -P)" >"$venv/.installed"
    exit 0
fi
[ "$cmd" = prepare ] || { echo "scripts/venv.sh: unknown command $cmd" >&2; exit 2; }
py=$1 venv=$2
shift 2
here=$(pwd -P)
stamp="$venv/.installed"

fresh() { # why, then (re)make the venv
    echo "make: $venv: $1"
    if [ -e "$venv" ]; then "$py" -m venv --clear "$venv"; else "$py" -m venv "$venv"; fi
    exit 3
}

[ -e "$venv/bin/python" ] || fresh "no venv here yet: making it"
"$venv/bin/python" -I -c '' 2>/dev/null || fresh "its python does not run: making it again"
# a venv records where it was made (activate's VIRTUAL_ENV, its scripts' #! lines)
made=$(sed -n 's/^ *VIRTUAL_ENV=["'\'']\{0,1\}\([^"'\'']*\).*/\1/p' "$venv/bin/activate" 2>/dev/null | head -n 1)
if [ -n "$made" ] && [ "$made" != "$(cd "$venv" && pwd)" ] && [ "$made" != "$(cd "$venv" && pwd -P)" ]; then
    fresh "it was made at $made (copied here, its scripts run that venv): making it again"
fi
# where its bertlab comes from, isolated from this directory and PYTHONPATH
if where=$("$venv/bin/python" -I -c 'import os, autograder
print(os.path.dirname(os.path.dirname(os.path.realpath(autograder.__file__))))' 2>/dev/null); then
    if [ "$where" != "$here" ]; then
        fresh "its editable install runs the code of $where, another checkout: making it again"
    fi
else
    echo "make: $venv: bertlab is not installed in it: installing"
    exit 3
fi
want="$(digest "$@") $here"
have=$(cat "$stamp" 2>/dev/null || true)
[ "$have" != "$want" ] || exit 0
if [ -f "$stamp" ] && [ ! -s "$stamp" ] && [ -z "$(find "$@" -newer "$stamp")" ]; then
    # an empty stamp, from before stamps held a digest, newer than every file it was
    # installed from: taken as it is, once
    echo "$want" >"$stamp"
    exit 0
fi
echo "make: $venv: installed from other requirements (or not to the end): installing"
exit 3
