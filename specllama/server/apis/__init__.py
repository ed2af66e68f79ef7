"""The HTTP APIs the server speaks, each a `Dialect` (base.py) over one engine path."""
