"""What starts and wires several services.

The AWS emulator, services as child processes built from their typed settings, the one
builder every local stack is assembled by (`builder`), the one supervisor that restarts its
processes, and the local stack of `spotgate up`.
"""
