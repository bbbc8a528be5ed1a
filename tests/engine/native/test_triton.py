"""The Triton shared-prefix kernel (qlm/engine/native/triton_attention.py) in Triton's
interpreter on this CPU, against the torch path: run by triton_check.py in the vLLM
environment, which has triton (qlm's own environment does not)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.vllm_fixtures import REPO, vllm_python_or_skip


def test_the_triton_kernel_matches_the_torch_path_in_the_interpreter() -> None:
    python = vllm_python_or_skip()
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [str(python), str(Path(__file__).with_name("triton_check.py"))],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("\n") == 5, done.stdout  # every case ran
