#!/usr/bin/env bash
# Installs the Debian 12 packages dsv4.cpp needs to build, test and serve.
# Idempotent; skips apt entirely when everything is already there.
set -euo pipefail
PACKAGES=(build-essential cmake ninja-build pkg-config ca-certificates curl
          nlohmann-json3-dev libcli11-dev libpcre2-dev libicu-dev libcpp-httplib-dev libboost-dev
          libgtest-dev libbenchmark-dev libdnnl-dev clang libclang-rt-14-dev python3
          # Debian builds oneDNN with its OpenCL runtime: its CMake package config
          # calls find_package(OpenCL) and fails without these two.
          ocl-icd-opencl-dev opencl-headers)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The API tests drive the server with the official `openai` npm package.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
