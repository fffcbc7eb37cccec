"""The dashboard as a person sees it (issue 27): TensorBoard's Custom Scalars tab of a run with
the three DP-SGD callbacks, rendered by headless Chromium. Skipped, with the reason, where no
Chromium is installed (``apt-get install chromium``); the layout itself is checked without a
browser in ``tests/callbacks/test_dashboard.py``."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time

import pytest

from tests.callbacks.test_dashboard import _fit

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
pytestmark = [
    pytest.mark.skipif(BROWSER is None, reason="no headless Chromium on this machine (apt-get install chromium)"),
    pytest.mark.filterwarnings("ignore:.*(backward hook|does not have many workers|secure RNG).*"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def screenshot(url: str, path, *, wait_ms: int = 8000) -> None:
    """Headless Chromium's screenshot of ``url`` into ``path`` (PNG)."""
    assert BROWSER is not None
    subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--virtual-time-budget={wait_ms}", "--window-size=1400,1800",
                    f"--screenshot={path}", url], check=True, capture_output=True, timeout=120)


def test_the_dashboard_renders_in_a_browser(tmp_path):
    from audit_callbacks.callbacks import CanaryAudit, LabelDPLowerBound, LabelReconstructionAttack

    _fit(tmp_path, [CanaryAudit(100, seed=0, bootstrap=0), LabelReconstructionAttack(), LabelDPLowerBound()])
    port = _free_port()
    board = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(tmp_path / "run"),
                              "--host", "127.0.0.1", "--port", str(port)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(120):  # TensorBoard listens within a few seconds
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.25)
        out = tmp_path / "dashboard.png"
        screenshot(f"http://127.0.0.1:{port}/#custom_scalars", out)
        assert out.exists() and out.stat().st_size > 10_000
    finally:
        board.terminate()
        board.wait(timeout=30)
