"""Jobs, job classes and trace loaders."""
