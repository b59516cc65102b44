"""`python -m vit_inspect` runs the command line."""
import sys

from vit_inspect.cli.main import main

sys.exit(main())
