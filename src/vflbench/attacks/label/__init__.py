"""Label-inference attacks."""
