"""`python -m engine serve ...`: the engine process (see engine/server/cli.py)."""
import sys

from engine.server.cli import main

if __name__ == "__main__":
    sys.exit(main())
