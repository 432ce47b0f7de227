"""The gateway's HTTP routes, one module per concern, each with a `setup_…(app)` adding them."""
