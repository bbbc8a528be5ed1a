"""`.venv/bin/python -m benchmarks.density_live [...]` runs this benchmark: main.py; the
package's other modules are what it is made of."""

import sys

from benchmarks.density_live.main import main

sys.exit(main(sys.argv[1:]))
