"""`.venv/bin/python benchmarks/soak.py [...]`: the soak benchmark's entry point. The benchmark
is the package benchmarks/soak/ (which `from benchmarks import soak` imports: a package takes
precedence over a module of the same name)."""

import sys
from pathlib import Path

if __name__ == "__main__":
    ROOT = Path(__file__).resolve().parent.parent
    sys.path[:] = [
        str(ROOT),
        *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"),
    ]
    from benchmarks.soak.main import main

    sys.exit(main(sys.argv[1:]))
