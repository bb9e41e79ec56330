"""``python -m hvd_bert`` is the ``hvd-bert`` command."""

from hvd_bert.cli import main

raise SystemExit(main())
