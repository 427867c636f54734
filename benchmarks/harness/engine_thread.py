"""Run a CPU benchmark's model work the way the hf engine runs it: on one thread of its own.

The engine reorders its oneDNN weights and runs every forward on its loop thread
(``HFEngine._loop``): that thread owns the only OpenMP team (onednn_linear.py). Grad mode is
per thread, so the worker turns it off itself (left on, every forward records autograd
state: a slowdown that looks like a leak). An exception on the worker is raised again here,
so a failed case stops the script instead of leaving a partial table.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_like_engine(work: Callable[[], None]) -> None:
    """``work()`` on a fresh thread with grad off; waits for it and re-raises what it raised."""
    failed: list[BaseException] = []

    def target() -> None:
        import torch

        torch.set_grad_enabled(False)
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            failed.append(exc)

    thread = threading.Thread(target=target, name="engine-like")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
