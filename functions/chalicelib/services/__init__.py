"""Services: one function per use case; they take their stores and ``now`` and raise domain errors."""
