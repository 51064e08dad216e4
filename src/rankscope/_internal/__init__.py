"""rankscope internals: nothing here is public API; import from ``rankscope``."""
