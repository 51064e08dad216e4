"""``python -m rankscope.cli``: the ``rankscope`` command."""

import sys

from .app import main

sys.exit(main())
