"""`python -m app.engine_child --parent-pid P serve ...`: the engine server, ending with its parent.

EngineProcess (app/engine_process.py) starts every engine through this wrapper, so that an engine
never outlives the process that started it: if the app (or a test run, or a benchmark) is killed
with no chance to call stop(), the engine would keep its port and its memory forever. A watchdog
thread checks once a second that the parent is still there and otherwise asks the server to shut
down (SIGTERM: uvicorn's graceful exit), then exits hard if that takes too long. Everything else
is `python -m engine serve`, plus the app's downloads behind Ollama's /api/pull (app/api_pull.py).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import psutil

CHECK_INTERVAL_S = 1.0
GRACE_S = 10.0


def parent_alive(ppid: int) -> bool:
    # POSIX re-parents an orphan (getppid changes); Windows keeps the old id, so ask whether it runs
    return os.getppid() == ppid and psutil.pid_exists(ppid) if os.name == "posix" else psutil.pid_exists(ppid)


def watch_parent(ppid: int) -> None:
    while parent_alive(ppid):
        time.sleep(CHECK_INTERVAL_S)
    print(f"engine: parent process {ppid} is gone; shutting down", file=sys.stderr, flush=True)
    signal.raise_signal(signal.SIGTERM)
    time.sleep(GRACE_S)
    os._exit(1)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] != "--parent-pid":
        print("usage: python -m app.engine_child --parent-pid PID serve [engine flags]", file=sys.stderr)
        return 2
    ppid = int(argv[1])
    threading.Thread(target=watch_parent, args=(ppid,), name="parent-watchdog", daemon=True).start()
    from app.api_pull import SettingsPuller
    from engine.serve import main as engine_main  # after the watchdog: the import takes seconds

    return engine_main(argv[2:], make_puller=SettingsPuller)


if __name__ == "__main__":
    sys.exit(main())
