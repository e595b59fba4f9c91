"""`python -m lightspeed_gateway` = the `lightspeed` command."""

import sys

from lightspeed_gateway.cli import main

sys.exit(main())
