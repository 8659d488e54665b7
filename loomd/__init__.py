"""loomd: the Loom daemon, HTTP on top of loomrt with no model knowledge."""
