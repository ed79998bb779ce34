"""`make integration`: the integration tests as two pytest sessions side by side.

The scheduler backends' module (`tests/integration/test_schedulers.py`) starts clusters of its own,
one backend after another (its scheduler, its controller, five KWOK nodes), and spends most of its
time waiting on their schedulers' cycles; every other module shares the session's cluster. One after
the other they added up (the backends' tests took about 8 of the suite's 38 minutes on the project's 2-core
machine, whose CPU was under 40 % busy for most of the run); side by side, the backends' session runs
under `nice`, so the main session's tests, some of which bound how long a mechanism takes, keep the
CPU first.

The backends' output goes to a file that is printed when the run ends (its path is shown at once).
SIGINT or SIGTERM (Ctrl-C, or CI's time limit) is passed on to both sessions as SIGINT, so each
stops its tests and tears down its clusters. The exit status is the first non-zero of the two.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BACKEND_MODULES = "tests/integration/test_schedulers.py"   # a pattern: the backends' session takes what matches
NICENESS = 10


def _session(args: list[str], **kwargs) -> subprocess.Popen:
    # A session of its own: a terminal's Ctrl-C or CI's signal reaches this runner only, which passes
    # one SIGINT to each (two would cut their teardown short).
    return subprocess.Popen([sys.executable, "-m", "pytest", *args], cwd=ROOT, start_new_session=True, **kwargs)


def main(argv: list[str]) -> int:
    backends = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(BACKEND_MODULES))
    log_fd, log_name = tempfile.mkstemp(prefix="gangctl-it-backends-", suffix=".log")
    # A basetemp of its own: pytest deletes all but the newest three numbered ones, which may be the
    # main session's folders while it runs.
    basetemp = tempfile.mkdtemp(prefix="gangctl-it-backends-")
    print(f"[integration] the scheduler backends' module runs beside the rest (nice {NICENESS}); "
          f"their output is shown at the end and meanwhile in {log_name}", flush=True)
    side = _session(["-q", "-ra", "--durations=5", f"--basetemp={basetemp}", *argv, *backends],
                    stdout=log_fd, stderr=subprocess.STDOUT, preexec_fn=lambda: os.nice(NICENESS))
    os.close(log_fd)
    main_session = _session(["-q", "-ra", "--durations=10", *argv, "tests/integration",
                             *(f"--ignore={module}" for module in backends)])

    def interrupt(signum, frame) -> None:
        for proc in (main_session, side):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)

    status = main_session.wait()
    if side.poll() is None:
        print(f"[integration] waiting for the scheduler backends' session ({log_name})", flush=True)
    side_status = side.wait()
    print(f"\n[integration] the scheduler backends' session ({', '.join(Path(m).name for m in backends)}), "
          f"exit {side_status}:", flush=True)
    sys.stdout.write(Path(log_name).read_text(errors="replace"))
    return status or side_status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
