"""The spotgate stack and its constructs, one module per concern."""
