"""`python -m spec_decode.infer`: see the package's docstring."""

import sys

from spec_decode.infer import cli

if __name__ == "__main__":
  sys.exit(cli.main())
