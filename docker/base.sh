#!/usr/bin/env bash
# The base image bertlab's image builds on, made present. Exits 0 at once if it is there.
#
#   bertlab-base:*  (the Makefile's default, bertlab-base:bookworm) Debian bookworm with its
#                   Python 3.11, made on this machine: debootstrap from a Debian mirror
#                   (MIRROR, default deb.debian.org), then `docker import`. For machines that
#                   reach a Debian mirror (or a proxy of one) but no Docker registry.
#                   BASE_ROOTFS=DIR imports a tree debootstrap made already instead (it
#                   must hold python3 and python3-venv).
#   anything else   (python:3.11-slim...) docker pull.
#
# Exits 3 if the image cannot be had here (no debootstrap, not root, no registry), saying
# what to do; 1 if making it failed.
#
# usage: docker/base.sh [TAG]
set -euo pipefail
tag=${1:-bertlab-base:bookworm}
mirror=${MIRROR:-http://deb.debian.org/debian}
if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "base image $tag: present"
    exit 0
fi
cannot() {
    echo "docker/base.sh: no image $tag, and it cannot be made here: $*." >&2
    exit 3
}
imported() { # the tree on stdin (a tar) as the image $tag
    docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
        -c 'CMD ["python3"]' - "$tag" >/dev/null
}
case "$tag" in
    bertlab-base:*) ;;
    *)
        docker pull "$tag" || cannot "docker pull failed (no registry?); the default base," \
            "bertlab-base:bookworm, is made with debootstrap instead"
        exit 0
        ;;
esac
if [ -n "${BASE_ROOTFS:-}" ]; then
    [ -x "$BASE_ROOTFS/usr/bin/python3" ] || cannot "BASE_ROOTFS=$BASE_ROOTFS holds no usr/bin/python3"
    echo "making $tag from $BASE_ROOTFS"
    tar -C "$BASE_ROOTFS" -c . | imported
    echo "base image $tag: made"
    exit 0
fi
command -v debootstrap >/dev/null || cannot "debootstrap is not installed (apt-get install debootstrap)," \
    "and no BASE_ROOTFS was given; where Docker Hub answers, DOCKER_BASE=python:3.11-slim"
[ "$(id -u)" = 0 ] || cannot "debootstrap needs root (sudo make docker), or BASE_ROOTFS=DIR"
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
echo "making $tag with debootstrap from $mirror (a few minutes)"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$rootfs" "$mirror" >/dev/null || {
    echo "docker/base.sh: debootstrap from $mirror failed (MIRROR= another Debian mirror)" >&2
    exit 1
}
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | imported
echo "base image $tag: made"
