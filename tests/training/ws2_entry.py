"""torchrun entry for the world-size-2 test: rank 1 alone sees a NaN loss on its 3rd batch, so the skip can
only be agreed if the verdict is all-reduced. Then the normal CLI runs.

`VTG_TEST_NAN_CALL` (default 3) is the forward call of rank 1 (counted from this process's start) whose loss
becomes NaN; `0` disables it (a run resumed past the skip must not inject a second one)."""

import os
import sys

from training import engine
from training.__main__ import main
from vtg.cli_common import run_cli

_real = engine.DeepSpeedEngine.forward
_calls = {"n": 0}
_NAN_CALL = int(os.environ.get("VTG_TEST_NAN_CALL", "3"))


def _flaky(self, inputs):
    _calls["n"] += 1
    loss = _real(self, inputs)
    return loss * float("nan") if os.environ["RANK"] == "1" and _calls["n"] == _NAN_CALL else loss


engine.DeepSpeedEngine.forward = _flaky

if __name__ == "__main__":
    sys.exit(run_cli(main))
