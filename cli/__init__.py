"""The `spotgate` command line: above every service, it starts and steers them."""
