#!/usr/bin/env bash
# parts.sh: move folders to the GPU machine in pieces that fit beside the working tree.
#
# Every call to the GPU machine sends the whole working tree with what it carries, 64 MiB at most;
# the SGLang bundle's chunks are 40-43 MiB each, so a larger tree leaves no room for them
# (docs/decisions.md D76, D78). This cuts a tar of the folders into pieces that fit, one piece per
# call, and puts them together on the machine (which keeps /tmp between calls while it is warm).
#
# Here (from the repository root):
#   bash tools/device/parts.sh make [--mib N] DIR...     -> .device-parts/NN/{piece,INFO} (git-ignored)
#       N: the size of a piece; default: what is left of 62 MiB beside the working tree, so that
#       each call's carry fits. INFO holds the piece count and the sha256 of the whole tar.
# There, one call per piece, each carrying `.device-parts/NN` while the machine is still warm:
#   bash tools/device/parts.sh receive .device-parts/NN  -> /tmp/device-parts/
#       exit 0 and `complete` once every piece is there and the whole tar's sha256 matches, after
#       unpacking it into /tmp/device-parts/tree; exit 2 naming the pieces still missing; exit 1 on
#       a damaged piece or a tar that does not match.
#   bash tools/device/parts.sh install-bundle             (after `complete`)
#       installs the SGLang bundle found in the tree into /opt/sgl as the chunks' own installer does,
#       and keeps sglang-env where tools/device/cptest-env.sh finds it (/opt/cpt-env/).
#   bash tools/device/parts.sh install-extras             (after install-bundle)
#       installs the kernel extras (fa3, FlashMLA) of a set made with `.kernel-extras` among its
#       folders: runs each chunk folder's install-kernel-extras; exit 0 once they are installed.
set -euo pipefail
PARTS=.device-parts
THERE=${DEVICE_PARTS_DIR:-/tmp/device-parts}
LIMIT_MIB=62

tree_mib() {
  # What every call sends anyway: tracked files and untracked files git does not ignore. Tracked
  # files a sparse checkout leaves out are not in the tree, so they do not count (stat skips them).
  { git ls-files -z; git ls-files -z --others --exclude-standard; } \
    | { xargs -0 -r stat -c %s -- 2>/dev/null || true; } \
    | awk '{s += $1} END {printf "%d\n", (s + 1048575) / 1048576}'
}

make_parts() {
  local mib="" dirs=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --mib) mib="$2"; shift 2 ;;
      *) dirs+=("$1"); shift ;;
    esac
  done
  [ ${#dirs[@]} -gt 0 ] || { echo "parts.sh make: name the folders to send" >&2; exit 2; }
  if [ -z "$mib" ]; then
    mib=$(( LIMIT_MIB - $(tree_mib) ))
    [ "$mib" -ge 4 ] || { echo "parts.sh: the working tree leaves ${mib} MiB a call; make it smaller" >&2; exit 1; }
  fi
  rm -rf "$PARTS"; mkdir -p "$PARTS/tmp"
  # A folder's `.work` is the scratch its maker built it in (the kernel extras' is 366 MiB of
  # unpacked wheels): nothing there reads it, and sending it more than doubles the pieces.
  tar -cf "$PARTS/tmp/all.tar" --exclude=.work "${dirs[@]}"
  local whole; whole=$(sha256sum "$PARTS/tmp/all.tar" | cut -d' ' -f1)
  split -b "${mib}M" -d -a 2 "$PARTS/tmp/all.tar" "$PARTS/tmp/piece."
  local count; count=$(ls "$PARTS"/tmp/piece.* | wc -l)
  for p in "$PARTS"/tmp/piece.*; do
    local n="${p##*.}"
    mkdir -p "$PARTS/$n"
    mv "$p" "$PARTS/$n/piece"
    printf 'count %s\nwhole %s\npiece %s\n' "$count" "$whole" "$(sha256sum "$PARTS/$n/piece" | cut -d' ' -f1)" \
      > "$PARTS/$n/INFO"
  done
  rm -rf "$PARTS/tmp"
  echo "parts.sh: ${dirs[*]} in $count piece(s) of at most ${mib} MiB under $PARTS/ (carry one a call, in order)"
}

receive() {
  local dir="$1" n info count whole want
  n="$(basename "$dir")"; info="$dir/INFO"
  [ -f "$info" ] && [ -f "$dir/piece" ] || { echo "parts.sh receive: no piece in $dir" >&2; exit 1; }
  count=$(awk '$1 == "count" {print $2}' "$info"); whole=$(awk '$1 == "whole" {print $2}' "$info")
  want=$(awk '$1 == "piece" {print $2}' "$info")
  [ "$(sha256sum "$dir/piece" | cut -d' ' -f1)" = "$want" ] || { echo "parts.sh: piece $n is damaged" >&2; exit 1; }
  mkdir -p "$THERE"
  if [ -f "$THERE/whole" ] && [ "$(cat "$THERE/whole")" != "$whole" ]; then
    rm -rf "$THERE"; mkdir -p "$THERE"  # pieces of another set: start again
  fi
  echo "$whole" > "$THERE/whole"
  cp "$dir/piece" "$THERE/piece.$n"
  local missing=""
  for i in $(seq -f %02g 0 $(( count - 1 ))); do
    [ -f "$THERE/piece.$i" ] || missing="$missing $i"
  done
  if [ -n "$missing" ]; then echo "parts.sh: piece $n of $count here; still missing:$missing"; exit 2; fi
  cat $(for i in $(seq -f %02g 0 $(( count - 1 ))); do echo "$THERE/piece.$i"; done) > "$THERE/all.tar"
  [ "$(sha256sum "$THERE/all.tar" | cut -d' ' -f1)" = "$whole" ] \
    || { echo "parts.sh: the pieces put together do not match" >&2; exit 1; }
  rm -rf "$THERE/tree"; mkdir -p "$THERE/tree"
  tar -xf "$THERE/all.tar" -C "$THERE/tree"
  rm -f "$THERE"/piece.* "$THERE/all.tar"
  echo "complete: $(ls "$THERE/tree" | tr '\n' ' ')in $THERE/tree"
}

install_bundle() {
  local bundle="$THERE/tree/.sglang-bundle"
  [ -d "$bundle/c1" ] || { echo "parts.sh: no SGLang bundle in $THERE/tree" >&2; exit 1; }
  bash "$bundle/c1/install-bundle" "$bundle" --complete
  mkdir -p /opt/cpt-env && cp -f "$bundle/c3/sglang-env" /opt/cpt-env/
}

install_extras() {
  # Each chunk folder's installer copies its own part into the store; the last one to run finds the
  # set complete, checks every sha256 and installs the libraries, so its exit status is the answer.
  local extras="$THERE/tree/.kernel-extras" k rc=1
  [ -d "$extras/k1" ] || { echo "parts.sh: no kernel extras in $THERE/tree" >&2; exit 1; }
  for k in "$extras"/k*; do
    rc=0; python3 "$k/install-kernel-extras" || rc=$?
  done
  return "$rc"
}

case "${1:-}" in
  make) shift; make_parts "$@" ;;
  receive) shift; receive "$1" ;;
  install-bundle) install_bundle ;;
  install-extras) install_extras ;;
  *) echo "usage: parts.sh make [--mib N] DIR... | receive .device-parts/NN | install-bundle | install-extras" >&2
     exit 2 ;;
esac
