"""`python -m clients.python [generate] "prompt"` from the repository root: the `turnstile` CLI."""
import os
import sys

try:
    from turnstile_client.cli import main
except ImportError:  # not installed: use the package that sits beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from turnstile_client.cli import main

sys.exit(main())
