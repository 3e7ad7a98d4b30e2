#!/usr/bin/env bash
# Build the wheels the device run installs (the H200 machine has no registry access).
# Run here, in the repository root; the device command installs .whl/*.whl with --target.
set -euo pipefail
rm -rf core/build plugins/*/build examples/downstream/build .whl
python -m pip wheel -q --no-deps --no-build-isolation ./core ./plugins/sm90 ./plugins/sm100 ./plugins/sm120 ./examples/downstream ./pytest-hwprofile -w .whl
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d .whl platformdirs==4.14.5 tomli-w==1.2.0
