"""`python -m turnstile_client [generate] "prompt"`: the `turnstile` CLI."""
import sys

from turnstile_client.cli import main

sys.exit(main())
