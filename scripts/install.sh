#!/bin/sh
# The one install of Tessera: the Makefile (`make demo`, `make test`, CI's `make .venv/.installed`) and the
# Dockerfile (the tessera and tessera-agent images) both run this, so the tested install and the images
# cannot drift.
#
#   scripts/install.sh [VENV] [EXTRA ...]      VENV (relative to the repository root, or absolute) defaults to .venv
#
# Creates VENV with $PYTHON (default: python3.11, else python3), installs every pinned dependency with its
# hashes, then Tessera itself (editable, no dependencies: the lock has them). Without extras it installs
# requirements/runtime.txt (what serving needs: the images); EXTRA `dev` installs requirements/lock.txt
# instead (runtime + tests + benches: make and CI). `make lock` compiles runtime.txt constrained by lock.txt,
# so every runtime pin is the tested one (tests/deploy/test_images.py checks it). EXTRA `gpu` then swaps
# onnxruntime for onnxruntime-gpu (the same module, CUDA's execution provider) at the pin and hashes of
# requirements/gpu.txt; the tessera-agent image uses it.
set -eu

cd "$(dirname "$0")/.."
venv=${1:-.venv}
if [ "$#" -gt 0 ]; then shift; fi
python=${PYTHON:-$(command -v python3.11 || command -v python3)}
pip() { "$venv/bin/python" -m pip --quiet --disable-pip-version-check "$@"; }

lock=requirements/runtime.txt
for extra in "$@"; do
    case "$extra" in
        dev) lock=requirements/lock.txt ;;
        gpu) ;;
        *) echo "install.sh: unknown extra '$extra' (known: dev, gpu)" >&2; exit 2 ;;
    esac
done

"$python" -m venv "$venv"
pip install --require-hashes -r "$lock"
pip install --no-deps --no-build-isolation -e .

for extra in "$@"; do
    case "$extra" in
        dev) ;;
        gpu)
            # onnxruntime-gpu needs what onnxruntime needs (the lock has it): only the package changes.
            pip uninstall -y onnxruntime
            pip install --no-deps --require-hashes -r requirements/gpu.txt
            ;;
    esac
done
