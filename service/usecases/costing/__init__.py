"""The money's own room: every read of the dollars, behind one door (``dollars.dollars``)."""
