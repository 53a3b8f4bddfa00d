"""`python -m yt8m ...`, the entry point torchrun uses (`torchrun -m yt8m train ...`)."""

import sys

from yt8m.cli import main

sys.exit(main())
