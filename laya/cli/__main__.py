"""`python -m laya.cli ...`: the same as the `laya` command."""

import sys

from laya.cli import main

sys.exit(main())
