#!/usr/bin/env bash
# What can be checked of flake.nix without nixpkgs (no machine of this project reaches GitHub):
# it parses, and its outputs, evaluated against a stand-in nixpkgs (.ci/check-flake.nix), pin
# nixpkgs to a 40-hex revision, give every dev shell a `cptest` command (the shell's python -m
# cptest) and the package exactly pyproject's dependencies. Needs nix-instantiate (Debian's nix-bin).
set -euo pipefail
cd "$(dirname "$0")/.."
nix-instantiate --parse flake.nix >/dev/null
summary=$(nix-instantiate --eval --strict --json --expr 'import ./.ci/check-flake.nix { }')
echo "flake.nix: $summary"
