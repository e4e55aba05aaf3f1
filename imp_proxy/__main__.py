"""``python -m imp_proxy`` = ``imp-proxy``."""

import sys

from .cli import main

sys.exit(main())
