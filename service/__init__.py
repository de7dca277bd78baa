"""Turnstile gRPC front end: never imports torch."""
