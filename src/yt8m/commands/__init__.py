"""The `yt8m` commands, one module each: flags, wiring and output around the library (see yt8m.cli)."""
