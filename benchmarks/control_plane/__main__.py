"""`.venv/bin/python -m benchmarks.control_plane [...]` runs this benchmark: main.py; the
package's other modules are what it is made of."""

import sys

from benchmarks.control_plane.main import main

main(sys.argv[1:])
