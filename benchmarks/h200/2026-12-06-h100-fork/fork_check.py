"""Fork after nothing / NVML alone / hwprofile.profile(0); the child runs torch CUDA (and ops.router_gemm after profile).

    python3 fork_check.py none|nvml|profile

The parent makes Python's multi-threaded-fork DeprecationWarning an error. What ran on 2026-12-06 (fork_probe.txt),
reformatted since (the same statements).
"""

import os
import sys
import warnings

mode = sys.argv[1]
if mode == "nvml":
    import pynvml

    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
elif mode == "profile":
    import hwprofile

    hwprofile.profile(0)
warnings.simplefilter("error", DeprecationWarning)
pid = os.fork()
if pid == 0:
    try:
        import torch

        x = torch.randn(4, 7168, device="cuda").bfloat16()
        w = torch.randn(256, 7168, device="cuda").bfloat16()
        if mode == "profile":
            from hwprofile import ops

            y = ops.router_gemm(x, w)
        else:
            y = x.float() @ w.float().t()
        torch.cuda.synchronize()
        print(mode, "child ok", float(y.abs().sum()) > 0, flush=True)
        os._exit(0)
    except BaseException as e:  # noqa: BLE001 - the child reports any failure through its exit code
        print(mode, "child", type(e).__name__, e, flush=True)
        os._exit(2)
_, st = os.waitpid(pid, 0)
print(mode, "exit", os.waitstatus_to_exitcode(st))
