"""Build-time tools, not part of the installed appliance (run from a source checkout)."""
