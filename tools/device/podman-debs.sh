#!/usr/bin/env bash
# podman-debs.sh: fetch what tools/device/podman_try.sh carries to the GPU machine into .podman-debs/
# (Debian bookworm's podman and what it runs with; .podman-debs/extra: libraries the machine may lack,
# used there only where its loader cache has none of that name). Run on a Debian bookworm host with
# its apt lists; ~20 MiB. `echo /.podman-debs/ >> .git/info/exclude` keeps them out of git.
set -euo pipefail
mkdir -p .podman-debs/extra
(cd .podman-debs && apt-get download podman conmon crun runc golang-github-containers-common libgpgme11 \
  libassuan0 libgpg-error0 libseccomp2 libsubid4 libyajl2 catatonit busybox-static libdevmapper1.02.1 libbtrfs0)
(cd .podman-debs/extra && apt-get download libglib2.0-0 libsemanage2 libsepol2 libpam0g libaudit1 libcap-ng0 \
  libbz2-1.0 libudev1 libcap2 libsystemd0 libgcrypt20 liblz4-1 libzstd1 liblzma5 libpcre2-8-0 libselinux1 \
  libcrypt1 libffi8 libmount1 libblkid1)
du -sh .podman-debs
