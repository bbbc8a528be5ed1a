"""`.venv/bin/python -m benchmarks.sim_quality [...]` runs this benchmark: main.py; the
package's other modules are what it is made of."""

import sys

from benchmarks.sim_quality.main import main

main(sys.argv[1:])
