#!/usr/bin/env bash
# The Python SDK (sdk/python, distribution cordon-sandbox) runs on httpx; its tests need
# pytest, mypy (the package and its README example type-check under --strict), and wheel
# so that `pip install --no-build-isolation` of the SDK (the README test)
# builds it with the host's setuptools, without a download; pytest-xdist runs the suite's
# files on two workers (scripts/sdk-tests.sh). Idempotent: installs only what is missing.
# part: test
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
pip_install 'pytest>=7,<9' 'pytest-xdist>=3.5,<4' 'httpx>=0.27,<1' 'wheel>=0.40' 'mypy>=1.10,<2'
