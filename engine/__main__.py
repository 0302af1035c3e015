"""`python -m engine serve ...`: the engine process (see engine/serve.py)."""
import sys

from engine.serve import main

if __name__ == "__main__":
    sys.exit(main())
