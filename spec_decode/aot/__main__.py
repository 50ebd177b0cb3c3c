import sys

from spec_decode.aot import cli

sys.exit(cli.main())
