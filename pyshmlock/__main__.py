"""`python -m pyshmlock` runs the command-line tool (see pyshmlock.cli)."""
import sys

from .cli import main

sys.exit(main())
