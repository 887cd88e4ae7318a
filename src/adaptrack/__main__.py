"""``python -m adaptrack``: the ``adaptrack`` command (:func:`adaptrack.cli.main`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
