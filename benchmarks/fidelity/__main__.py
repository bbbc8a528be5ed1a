"""`.venv/bin/python -m benchmarks.fidelity [...]` runs this benchmark: main.py; the
package's other modules are what it is made of."""

import sys

from benchmarks.fidelity.main import main

sys.exit(main(sys.argv[1:]))
