"""The Turnstile Python client, installable as `turnstile-client` (package `turnstile_client`).

This file only lets `python -m clients.python generate "prompt"` run from the repository root.
"""
