"""The `kiln` command line: one module per command group; main.py only registers them."""
