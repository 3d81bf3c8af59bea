"""The ``gpuwarden`` command line and its sub-commands."""
