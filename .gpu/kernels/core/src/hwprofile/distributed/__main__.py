"""``python -m hwprofile.distributed`` (and ``torchrun ... -m hwprofile.distributed``); never imported by the package itself.

Runs :func:`hwprofile.distributed._bringup.main`. The command lives in ``_bringup`` because
``hwprofile.distributed`` re-exports ``main``: were it defined here, the package would import this
module, and ``python -m`` would warn and execute it a second time as ``__main__``.
"""

from __future__ import annotations

import sys

from ._bringup import main

if __name__ == "__main__":  # pragma: no cover - exercised through torchrun in the tests
    sys.exit(main())
