"""`python -m envcheck` and the zipapp entry (doctor uploads envcheck as one .pyz file)."""

import sys

from envcheck.cli import main

sys.exit(main())
