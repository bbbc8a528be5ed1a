"""`.venv/bin/python -m benchmarks.solver [...]` runs this benchmark: main.py; the
package's other modules are what it is made of."""

import sys

from benchmarks.solver.main import main

main(sys.argv[1:])
