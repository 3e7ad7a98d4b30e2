"""`import hwprofile` is cheap and side-effect free; detection leaves a forkable process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import json, os, sys
before = set(os.environ.items())
import hwprofile
after_import = {m for m in sys.modules if m.split('.')[0] in ('torch', 'cuda', 'pynvml')}
hwprofile.detect()
p = hwprofile.profile(0) if hwprofile.detect().devices else None
after_profile = {m for m in sys.modules if m.split('.')[0] in ('torch', 'cuda')}
print(json.dumps({"import": sorted(after_import), "profile": sorted(after_profile), "env_changed": set(os.environ.items()) != before}))
"""


@pytest.mark.parametrize("device", [None, "h200", "gb300,rtx-pro-6000"])
def test_import_and_profile_import_no_torch_or_cuda(device: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HWPROFILE_DEVICE"}
    if device:
        env["HWPROFILE_DEVICE"] = device
    out = json.loads(subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout)
    assert out["import"] == [], "import hwprofile must not import torch, cuda-python or NVML"
    assert out["profile"] == [], "profile() must not import torch or cuda-python"
    assert out["env_changed"] is False, "profile() must not write the environment"


def test_plugin_modules_import_cheaply() -> None:
    code = (
        "import sys, hwprofile_sm90, hwprofile_sm100, hwprofile_sm120; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch','cuda')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.hwprofile_per_device  # detects and profiles the session's device
def test_process_can_fork_after_detection_and_profile() -> None:
    code = r"""
import os, hwprofile
hwprofile.detect(); hwprofile.profile(0) if hwprofile.detect().devices else None
pid = os.fork()
if pid == 0:
    import hwprofile as h
    h.reset(); h.detect()
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "0"


def test_first_profile_leaves_slow_modules_unloaded() -> None:
    """The start-up budget (issue 2) depends on these staying out of a first profile()."""
    code = r"""
import sys
before = set(sys.modules)
import hwprofile
hwprofile.profile(0)
slow = ('logging', 'json', 'platformdirs', 'importlib.metadata', 'importlib.resources', 'tomllib', 'configparser', 'tempfile')
print(' '.join(sorted(m for m in set(sys.modules) - before if m in slow or m.split('.')[0] in slow)))
"""
    # rtx-pro-6000: the sm120 plugin ships no stamped thresholds, so no staleness warning is logged
    env = {**os.environ, "HWPROFILE_DEVICE": "rtx-pro-6000"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == []


LOGGER_PROBE = r"""
import sys
from hwprofile._log import get_logger
log = get_logger("hwprofile.probe")
log.debug("dropped %s", 1)
log.info("dropped %s", 2)
print("logging" in sys.modules)
log.warning("shown %s", 3)
print("logging" in sys.modules)
"""


def test_lazy_logger_imports_logging_only_to_emit() -> None:
    p = subprocess.run([sys.executable, "-c", LOGGER_PROBE], capture_output=True, text=True, check=True)
    assert p.stdout.split() == ["False", "True"]
    assert p.stderr.strip() == "shown 3"  # logging's last-resort handler, as with a plain logger


def test_lazy_logger_reaches_configured_logging(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from hwprofile._log import get_logger

    log = get_logger("hwprofile.test")

    def caller() -> None:
        log.debug("d %d", 1)
        log.info("i")
        log.warning("w")
        log.error("e")

    with caplog.at_level(logging.DEBUG, logger="hwprofile.test"):
        caller()
    assert [(r.levelname, r.getMessage(), r.funcName) for r in caplog.records] == [
        ("DEBUG", "d 1", "caller"),
        ("INFO", "i", "caller"),
        ("WARNING", "w", "caller"),
        ("ERROR", "e", "caller"),
    ]
    assert log.isEnabledFor(logging.CRITICAL) and log.name == "hwprofile.test"  # the rest goes to the real logger
