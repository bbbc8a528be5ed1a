"""Entry point: `.venv/bin/python benchmarks/density_live.py [...]` runs the benchmark in the
package benchmarks/density_live/ (a package takes precedence over a module of the same name)."""

import sys
from pathlib import Path

if __name__ == "__main__":
    ROOT = Path(__file__).resolve().parent.parent
    sys.path[:] = [
        str(ROOT),
        *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"),
    ]
    from benchmarks.density_live.main import main

    sys.exit(main(sys.argv[1:]))
