"""A benchmark stopped by SIGTERM (`timeout`, `kill`) still deletes its cluster (benchmarks/local.py)."""
from __future__ import annotations

import os
import signal
import time

import pytest

from benchmarks import local


def test_sigterm_inside_a_benchmarks_cluster_runs_its_cleanup_and_exits_143():
    cleaned = []
    with pytest.raises(SystemExit) as stopped:
        with local._sigterm_exits():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)   # the handler interrupts this at once
                pytest.fail("SIGTERM did not stop the run")
            finally:
                cleaned.append("down")
    assert stopped.value.code == 143 and cleaned == ["down"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "the default comes back outside"


def test_a_handler_someone_else_installed_is_left_alone():
    def mine(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, mine)
    try:
        with local._sigterm_exits():
            assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
