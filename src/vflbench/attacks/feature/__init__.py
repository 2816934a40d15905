"""Feature-reconstruction attacks by a malicious active party (DMAVFL, DMAVFL_sync, AGN, FSHA)."""
