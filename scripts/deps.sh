#!/usr/bin/env bash
# Installs the Debian packages smolrt builds with, only those missing. Needs root (or sudo).
set -euo pipefail
pkgs=(cmake ninja-build g++ make git unzip python3-pip
      libgtest-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev libutf8proc-dev libedit-dev
      libboost-dev prometheus-cpp-dev
      clang libclang-rt-14-dev clang-format)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
