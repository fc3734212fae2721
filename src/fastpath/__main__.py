"""`python -m fastpath` is the `fastpath` console script."""

from fastpath.cli import main

raise SystemExit(main())
