"""`vtg.gpus`: the flow counts GPUs without importing torch where no GPU driver is loaded, and asks torch where one
is (issue 40: the import cost 1.8 s of CPU per flow run)."""

import subprocess
import sys
from pathlib import Path

from vtg import gpus

REPO = Path(__file__).resolve().parents[2]


def test_without_a_driver_the_flow_s_questions_never_import_torch():
    code = ("import sys\n"
            "from vtg import gpus\n"
            "gpus.DRIVER_NODES = ('/nonexistent/nvidiactl',)\n"
            "from flows.evaluator import visible_gpus\n"
            "from flows.stages import _has_cuda\n"
            "assert 'torch' not in sys.modules, 'imported by the flow modules themselves'\n"
            "print(visible_gpus(), _has_cuda(), 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "False", "False"]


def test_with_a_driver_node_torch_answers(tmp_path, monkeypatch):
    import torch

    node = tmp_path / "nvidiactl"
    node.touch()
    monkeypatch.setattr(gpus, "DRIVER_NODES", (str(tmp_path / "absent"), str(node)))
    assert gpus.gpu_driver_present()
    expected = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert gpus.visible_gpu_count() == expected
    monkeypatch.setattr(gpus, "DRIVER_NODES", (str(tmp_path / "absent"),))
    assert not gpus.gpu_driver_present() and gpus.visible_gpu_count() == 0
