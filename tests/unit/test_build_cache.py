"""The build cache: one build of a cache folder at a time across processes, reused once complete."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from gangctl.cluster.build import EXTRA_MODULES, _exclusive, ensure_module, go_version, go_binary, module_key

REPO = Path(__file__).resolve().parents[2]


def try_lock_elsewhere(folder: Path) -> str:
    """Another process asks for the folder's lock without waiting: 'got' or 'busy'."""
    code = textwrap.dedent(f"""
        import fcntl
        with open({str(folder / '.lock')!r}, "w") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                print("got")
            except BlockingIOError:
                print("busy")
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_a_cache_folder_is_built_by_one_process_at_a_time(tmp_path):
    folder = tmp_path / "kai-0000"
    with _exclusive(folder):
        assert try_lock_elsewhere(folder) == "busy", "a second build waits while the first holds the folder"
    assert try_lock_elsewhere(folder) == "got", "released when the build is done"


def test_a_complete_folder_is_reused_without_building_or_locking(tmp_path):
    module = EXTRA_MODULES["kai"]
    key = module_key(REPO / "integrations" / module.folder, go_version(go_binary()))[:8]
    done = tmp_path / f"kai-{key}"
    done.mkdir()
    (done / ".complete").write_text("go\n")
    with _exclusive(done):   # held elsewhere: a complete folder is returned without waiting for it
        assert ensure_module(module, REPO / "integrations", tmp_path) == done
