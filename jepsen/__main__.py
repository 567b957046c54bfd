"""``python -m jepsen test ...`` / ``python -m jepsen campaign ...`` (see :mod:`jepsen.cli`)."""

from jepsen.cli import main

raise SystemExit(main())
