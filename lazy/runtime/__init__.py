"""Running compiled graphs on the backing device."""
