"""Stubs generated from protos/turnstile/v1/generate.proto by grpc_tools.protoc (never edited by hand).

`pip install` (editable or wheel) generates them when missing; see setup.py. The server imports
these same modules, so a process holds one copy of the descriptors.
"""
