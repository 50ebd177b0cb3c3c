"""`python -m spec_decode.bench`: see `spec_decode.bench.cli`."""

import sys

from spec_decode.bench import cli

sys.exit(cli.main())
