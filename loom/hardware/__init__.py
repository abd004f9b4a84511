"""Hardware model: GPU specs, cluster topologies and allocation state."""
