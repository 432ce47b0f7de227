"""What starts and wires several services.

The AWS emulator, services as child processes built from their typed settings, and the
local stack of `spotgate up`.
"""
