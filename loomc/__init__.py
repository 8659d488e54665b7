"""loomc: the Loom compiler. Parses, checks and (in later stages) lowers `.loom` source."""

LOOMC_VERSION = "0.1.0"
