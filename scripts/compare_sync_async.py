#!/usr/bin/env python
"""Compare sync, async and SSP training: the same as ``hvdtrain compare`` (see --help)."""

import sys

from hvdtrain.cli import main

if __name__ == "__main__":
    sys.exit(main(["compare", *sys.argv[1:]]))
