"""`python -m bench`: the same as `fthsdp bench` (bench/suite.py)."""

import sys

from bench.suite import main

sys.exit(main())
