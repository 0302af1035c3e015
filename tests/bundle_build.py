"""The desktop bundle's build (packaging/build.py, minutes of one core) run in the background for
the whole session: tests/conftest.py starts it before the first test when a bundle test is
selected and runs the bundle tests last, so the build takes the CPU the other tests leave idle
(at nice 19) instead of the suite's time; tests/app/test_bundle.py waits for it.

The build runs detached (its own session, its launcher gone), so tests that count the test
process's children (tests/app/test_supervisor.py, test_mcp_host.py) never see it.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class BackgroundBuild:
    def __init__(self, out: Path):
        self.out, self.log, self.rc_file = out, out / "build.log", out / "build.rc"
        self.dist = out / "dist"
        self.pgid: int | None = None

    def start(self) -> None:
        cmd = " ".join(shlex.quote(str(a)) for a in (sys.executable, ROOT / "packaging" / "build.py",
                                                   "--dist", self.dist, "--work", self.out / "work"))
        script = (f"(nice -n 19 {cmd} > {shlex.quote(str(self.log))} 2>&1; "
                  f"echo $? > {shlex.quote(str(self.rc_file))}.tmp && "
                  f"mv {shlex.quote(str(self.rc_file))}.tmp {shlex.quote(str(self.rc_file))}) "
                  "< /dev/null > /dev/null 2>&1 &")
        launcher = subprocess.Popen(["sh", "-c", script], cwd=ROOT, start_new_session=True)
        launcher.wait()
        self.pgid = launcher.pid  # the new session's id is its process group's: the build's too

    def wait(self, timeout: float = 1800) -> tuple[int, str]:
        """(exit status, output) once the build has ended."""
        deadline = time.monotonic() + timeout
        while not self.rc_file.exists():
            if time.monotonic() > deadline:
                self.stop()
                return -1, f"not built within {timeout:.0f} s\n" + self.output()
            time.sleep(1)
        return int(self.rc_file.read_text().strip()), self.output()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        """Ends a build still running (a session cut short), by its process group."""
        if self.pgid is not None and not self.rc_file.exists():
            try:
                os.killpg(self.pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
