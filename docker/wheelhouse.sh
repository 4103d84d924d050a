#!/usr/bin/env bash
# Every wheel the image installs, downloaded here for the base image's Python and glibc,
# so that `docker build` installs offline (--no-index, from the build context) and only
# what requirements.txt and requirements-nodeps.txt pin, with their dependencies.
#
# usage (from the project root): docker/wheelhouse.sh VARIANT BASE DEST
#   VARIANT  cpu   torch's CPU build (VERSION+cpu): no nvidia-* or triton wheel, ever
#            cuda  torch as PyPI ships it for Linux, with its CUDA wheels (nvidia-*, triton)
#   BASE     the base image; its Python version and glibc choose the wheels
#   DEST     the wheelhouse; kept while the requirements, base and variant are the same
#
# The CPU build of torch comes from pip's own configuration (an index or find-links that
# holds it) or else from $TORCH_CPU_INDEX (PyTorch's CPU index).
set -euo pipefail
variant=$1 base=$2 dest=$3
py=${PYTHON:-python3}
torch_cpu_index=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
fail() { echo "docker/wheelhouse.sh: $*" >&2; exit 1; }
case "$variant" in cpu | cuda) ;; *) fail "VARIANT is cpu or cuda, not '$variant'" ;; esac

probe='import platform; print(platform.python_version(), platform.libc_ver()[1])'
read -r pyver glibc < <(docker run --rm --network none --entrypoint python3 "$base" -c "$probe") \
    || fail "cannot run python3 in the base image $base"
key="$variant $base $pyver glibc-$glibc $(cat requirements.txt requirements-nodeps.txt "$0" | sha256sum)"
if [ -f "$dest/.key" ] && [ "$(cat "$dest/.key")" = "$key" ]; then
    echo "wheelhouse $dest: up to date (Python $pyver, glibc $glibc, $variant)"
    exit 0
fi
torch=$(sed -n 's/^torch==\([^ #]*\).*/\1/p' requirements.txt)
[ -n "$torch" ] || fail "requirements.txt pins no torch version (torch==X)"

rm -rf "$dest"
mkdir -p "$dest"
major_minor=${pyver%.*}
platforms=()
for minor in $(seq "${glibc#*.}" -1 5); do  # every manylinux tag this glibc runs
    platforms+=(--platform "manylinux_2_${minor}_x86_64")
done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
opts=(--dest "$dest" --only-binary=:all: --python-version "$pyver" --implementation cp
    --abi "cp${major_minor/./}" "${platforms[@]}" --progress-bar off)
constraints=$dest/.constraints
if [ "$variant" = cpu ]; then
    echo "torch==$torch+cpu" >"$constraints"
    if ! "$py" -m pip download --quiet --no-deps "torch==$torch+cpu" "${opts[@]}" 2>/dev/null; then
        opts+=(--extra-index-url "$torch_cpu_index")
    fi
else
    # ===: exactly this version, never a local one such as +cpu that an index may hold too
    echo "torch===$torch" >"$constraints"
fi
echo "wheelhouse $dest: Python $pyver, glibc $glibc, torch $torch ($variant)"
"$py" -m pip download --quiet -r requirements.txt -c "$constraints" "${opts[@]}"
"$py" -m pip download --quiet --no-deps -r requirements-nodeps.txt "${opts[@]}"
if [ "$variant" = cpu ]; then
    cuda=$(cd "$dest" && ls | grep -iE '^(nvidia|triton)[-_]' || true)
    [ -z "$cuda" ] || fail "the CPU wheelhouse holds CUDA wheels: $cuda"
fi
echo "$key" >"$dest/.key"
du -sh "$dest"
